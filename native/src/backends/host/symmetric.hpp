// Symmetric memory on the host backend: one window per rank that every peer can address.
// The three kinds of DeepEP V2 (seed section 3), with memfds standing in for cuMem handles:
//   GPU-only : [device segment]                                   (cpu_bytes == 0)
//   elastic  : [device segment][own host segment]                 (cpu_bytes > 0, !hybrid)
//   hybrid   : [device segment][host segment of scale-up rank 0..N-1] (cpu_bytes > 0, hybrid),
//              each host segment exported as an fd by its owner and imported by the peers.
// Every rank sees the world through one flat reservation: rank p's window at base + p * stride, so
// translating a pointer to a peer is one multiply-add (NCCL's trick). Peers' host segments are also
// mapped behind their device segment; that path stands for the RDMA read of the scale-out domain.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/memory_kind.hpp"

namespace rankflow {

class HostSymmetricMemory {
 public:
  HostSymmetricMemory() = default;
  HostSymmetricMemory(const HostSymmetricMemory&) = delete;
  HostSymmetricMemory& operator=(const HostSymmetricMemory&) = delete;
  ~HostSymmetricMemory() { destroy(); }

  // Creates this rank's segments (memfds) and maps them into its own window.
  void create(int rank, int world, int64_t device_bytes, int64_t host_bytes, MemoryKind kind, int scaleup_ranks);
  ExportedSegments exported() const { return {device_fd_, host_fd_}; }
  // Maps every peer's segments (indexed by global rank; this rank's own entry is ignored). Where the
  // world's nodes share no memory, only the ranks [share_first, share_first + share_count) of this
  // rank's node are mapped; the others' windows stay unmapped (their entries are ignored).
  // Ranks outside `live` (elastic: they left; their fds are gone) stay unmapped until import_peer.
  void import_peers(const std::vector<ExportedSegments>& peers, int share_first = 0, int share_count = -1, uint64_t live = ~uint64_t(0));
  // Maps a replacement of `peer` (elastic groups) over its window: MAP_FIXED replaces the old mapping.
  void import_peer(int peer, const ExportedSegments& seg);
  // Unmaps everything and closes the fds this rank owns. Idempotent.
  void destroy();

  bool imported() const { return imported_; }
  MemoryKind kind() const { return kind_; }
  int64_t device_bytes() const { return device_bytes_; }
  int64_t host_bytes() const { return host_bytes_; }
  int64_t stride() const { return stride_; }
  uint8_t* window() const { return base_ + int64_t(rank_) * stride_; }
  uint8_t* peer_window(int peer) const { return base_ + int64_t(peer) * stride_; }
  // Host segment of `peer`: through my own window for hybrid scale-up peers, else behind its device segment.
  uint8_t* host_segment(int peer) const;
  // ptr inside my window -> the same offset in peer's window.
  uint8_t* translate(const void* ptr, int peer) const {
    return peer_window(peer) + (static_cast<const uint8_t*>(ptr) - window());
  }

 private:
  int rank_ = 0, world_ = 0, scaleup_ranks_ = 1;
  MemoryKind kind_ = MemoryKind::GpuOnly;
  int64_t device_bytes_ = 0, host_bytes_ = 0, stride_ = 0, reserved_bytes_ = 0;
  uint8_t* reservation_ = nullptr;  // what mmap returned (over-reserved for alignment)
  uint8_t* base_ = nullptr;         // 2 MiB aligned
  int device_fd_ = -1, host_fd_ = -1;
  bool imported_ = false;
};

}  // namespace rankflow
