// Signal slots as the host executor writes and reads them (the layout of protocol.hpp: sequence
// number, payload, tag; release on the sequence number, acquire to read it).
#pragma once

#include <cstdint>

#include "protocol.hpp"

namespace rankflow::host {

inline void signal(void* slot, uint64_t seq, uint64_t payload = 0, uint64_t tag = 0) {
  auto* w = static_cast<uint64_t*>(slot);
  __atomic_store_n(w + kSignalPayloadWord, payload, __ATOMIC_RELAXED);
  __atomic_store_n(w + kSignalTagWord, tag, __ATOMIC_RELAXED);
  __atomic_store_n(w + kSignalSeqWord, seq, __ATOMIC_RELEASE);
}
inline uint64_t slot_seq(const void* slot) {
  return __atomic_load_n(static_cast<const uint64_t*>(slot) + kSignalSeqWord, __ATOMIC_ACQUIRE);
}
// Read after an acquire of the sequence number.
inline uint64_t slot_payload(const void* slot) {
  return __atomic_load_n(static_cast<const uint64_t*>(slot) + kSignalPayloadWord, __ATOMIC_RELAXED);
}
inline uint64_t slot_tag(const void* slot) {
  return __atomic_load_n(static_cast<const uint64_t*>(slot) + kSignalTagWord, __ATOMIC_RELAXED);
}

}  // namespace rankflow::host
