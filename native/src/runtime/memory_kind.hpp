// The kinds of symmetric memory (DeepEP V2, seed section 3) and what a rank exports so that peers can
// map it: shared by the host backend (memfds) and the CUDA backend (cuMem POSIX-fd handles).
#pragma once

#include <cstdint>

namespace rankflow {

enum class MemoryKind { GpuOnly, Elastic, Hybrid };

inline const char* memory_kind_name(MemoryKind k) {
  switch (k) {
    case MemoryKind::GpuOnly: return "gpu";
    case MemoryKind::Elastic: return "elastic";
    case MemoryKind::Hybrid: return "hybrid";
  }
  return "?";
}

// The seed's rule (symmetric.hpp:291): no host bytes -> GPU-only; else hybrid or elastic by `hybrid`.
inline MemoryKind choose_memory_kind(int64_t host_bytes, bool hybrid) {
  if (host_bytes <= 0) return MemoryKind::GpuOnly;
  return hybrid ? MemoryKind::Hybrid : MemoryKind::Elastic;
}

// What one rank exports so that peers can map its memory. The fds stay owned by the exporter
// (within a process they are process-wide numbers; across processes they travel over SCM_RIGHTS).
struct ExportedSegments {
  int device_fd = -1;
  int host_fd = -1;  // -1 for GPU-only memory
};

}  // namespace rankflow
