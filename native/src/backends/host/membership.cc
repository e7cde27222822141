// The host executor's part of an elastic group's membership (runtime/ops/membership.cc): the live
// mask written into the rank's own workspace slot, and a replacement rank's segments mapped over the
// window of the rank it replaces (HostSymmetricMemory::import_peer, symmetric.cc).
#include "backend.hpp"

namespace rankflow::host {

void HostBackend::set_live(uint64_t mask, uint64_t epoch) {
  auto* w = reinterpret_cast<uint64_t*>(workspace() + c_.ws.live);
  __atomic_store_n(w + kLiveEpochWord, epoch, __ATOMIC_RELAXED);
  __atomic_store_n(w + kLiveMaskWord, mask, __ATOMIC_RELEASE);
}

void HostBackend::import_peer(int peer, const ExportedSegments& seg) { mem_.import_peer(peer, seg); }

}  // namespace rankflow::host
