// Symmetric memory on GPUs: one window per rank that every peer GPU addresses over NVLink.
// The three kinds of DeepEP V2 (seed section 3), with the same windows as the host backend's
// HostSymmetricMemory (native/src/host/symmetric.hpp), so the two executors share every offset:
//   GPU-only : [device segment]                                       (host_bytes == 0)
//   elastic  : [device segment][own host segment]                     (host_bytes > 0, !hybrid)
//   hybrid   : [device segment][host segment of scale-up rank 0..N-1] (host_bytes > 0, hybrid)
// Device segments are cuMemCreate(PINNED, DEVICE, POSIX_FILE_DESCRIPTOR); host segments are
// cuMemCreate(PINNED, HOST_NUMA = the node nearest the GPU, POSIX_FILE_DESCRIPTOR). Each is exported
// as an fd; peers import the fds (same process: directly; other processes: fds received over
// SCM_RIGHTS) and map them into one flat reservation, rank p's window at base + p * stride, so a
// pointer's translation to a peer is one multiply-add (NCCL's trick). Peers' host segments are mapped
// behind their device segment too, except a hybrid rank's scale-up peers, reached through its own
// window. No multicast objects and no managed memory, ever (shared-host rule).
#pragma once

#include <cuda.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "runtime/memory_kind.hpp"

namespace rankflow::cuda {

class DeviceContext;

// One set of kinds and exports for both backends.
using rankflow::choose_memory_kind;
using rankflow::ExportedSegments;
using rankflow::memory_kind_name;
using rankflow::MemoryKind;

class SymmetricMemory {
 public:
  SymmetricMemory() = default;
  SymmetricMemory(const SymmetricMemory&) = delete;
  SymmetricMemory& operator=(const SymmetricMemory&) = delete;
  ~SymmetricMemory() { destroy(); }

  // Creates this rank's segments on `dev` (made current), reserves the flat range for `world` windows,
  // maps its own segments into its window and exports them. Sizes are multiples of 2 MiB.
  // scaleup_ranks: ranks per NVLink domain (hybrid maps their host segments into every window).
  ExportedSegments create(int rank, int world, const DeviceContext& dev, int64_t device_bytes,
                          int64_t host_bytes, MemoryKind kind, int scaleup_ranks);
  ExportedSegments exported() const { return {device_fd_, host_fd_}; }
  // Maps every peer's segments (indexed by global rank; my own entry is ignored) and grants my GPU
  // access. The fds are borrowed, unless adopt_fds: then they are closed here (fds that came over
  // SCM_RIGHTS belong to the importer). Where the world's nodes share no memory, only the ranks
  // [share_first, share_first + share_count) of this rank's node are mapped; the other windows stay
  // reserved but unmapped (their entries are ignored). Call on the rank's thread, its context current.
  // Ranks outside `live` (elastic: they left; their fds are gone) stay unmapped until import_peer.
  void import_peers(const std::vector<ExportedSegments>& peers, bool adopt_fds = false, int share_first = 0,
                    int share_count = -1, uint64_t live = ~uint64_t(0));
  // Elastic: maps the segments of `peer`'s replacement (fds borrowed) over the old rank's ranges, at
  // the same addresses (peer tables and captured graphs keep them); the old mappings are unmapped
  // first (the physical memory goes once nothing maps it). Only while no kernel of this rank runs.
  void import_peer(int peer, const ExportedSegments& seg);
  // Closes the exported fds early, once every peer imported them (mappings keep the memory alive).
  void close_exported() noexcept;
  // Unmaps everything, frees the reservation and closes the fds this rank owns. Idempotent, noexcept:
  // safe from a destructor and after a kernel trap (errors of a dead context are ignored).
  void destroy() noexcept;

  bool created() const { return base_ != 0; }
  bool imported() const { return imported_; }
  MemoryKind kind() const { return kind_; }
  int rank() const { return rank_; }
  int world() const { return world_; }
  int64_t device_bytes() const { return device_bytes_; }
  int64_t host_bytes() const { return host_bytes_; }
  int64_t stride() const { return stride_; }
  // Whether the CPU may load/store host segments through these addresses (granted where the driver
  // allows HOST_NUMA access on the mapping; otherwise only GPUs reach them).
  bool host_cpu_access() const { return host_cpu_access_; }

  CUdeviceptr base() const { return base_; }  // rank 0's window
  CUdeviceptr peer_base(int peer) const { return base_ + CUdeviceptr(int64_t(peer) * stride_); }
  CUdeviceptr window() const { return peer_base(rank_); }
  // Host segment of `peer`: through my own window for hybrid scale-up peers, else behind its device
  // segment. 0 for GPU-only memory.
  CUdeviceptr host_segment(int peer) const;
  // Address inside my window -> the same offset in peer's window.
  CUdeviceptr translate(CUdeviceptr ptr, int peer) const { return peer_base(peer) + (ptr - window()); }
  // peer_base(0..world-1), the table kernels take (upload it once to device memory).
  std::vector<uint64_t> peer_table() const;

 private:
  void map(CUdeviceptr at, int64_t bytes, CUmemGenericAllocationHandle h, bool host_segment,
           const char* what);
  void map_fd(CUdeviceptr at, int64_t bytes, int fd, bool host_segment, const char* what);
  void unmap(CUdeviceptr at);  // the mapping made at `at`, if any

  int rank_ = 0, world_ = 0, scaleup_ranks_ = 1, device_ordinal_ = -1, numa_id_ = 0;
  MemoryKind kind_ = MemoryKind::GpuOnly;
  int64_t device_bytes_ = 0, host_bytes_ = 0, stride_ = 0, reserved_bytes_ = 0;
  CUdeviceptr base_ = 0;
  std::vector<std::pair<CUdeviceptr, int64_t>> mapped_;  // every cuMemMap, for cuMemUnmap
  int device_fd_ = -1, host_fd_ = -1;
  bool imported_ = false, host_cpu_access_ = true;
};

}  // namespace rankflow::cuda
