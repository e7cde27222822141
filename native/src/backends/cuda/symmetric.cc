// SymmetricMemory: cuMem segments exported as POSIX fds and mapped into one flat reservation per rank.
#include "symmetric.hpp"

#include <unistd.h>

#include <string>

#include "protocol.hpp"
#include "device.hpp"
#include "driver.hpp"

namespace rankflow::cuda {

namespace {

// A cuMem allocation handle released on scope exit: once mapped (or exported), the mapping and the
// fd keep the physical memory alive, so no handle outlives the call that made it.
struct HandleGuard {
  CUmemGenericAllocationHandle h = 0;
  bool live = false;
  ~HandleGuard() {
    if (live) driver().cuMemRelease(h);
  }
};

CUmemAllocationProp segment_prop(bool host, int device_ordinal, int numa_id) {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  // POSIX fds are what NCCL windows (2.28) require and what SCM_RIGHTS can carry between processes.
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  if (host) {
    // HOST_NUMA, not HOST: plain HOST allocations cannot be exported (requestedHandleTypes must be 0).
    prop.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
    prop.location.id = numa_id;
  } else {
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device_ordinal;
  }
  return prop;
}

void require_granularity(const CUmemAllocationProp& prop, const char* what) {
  size_t granularity = 0;
  RF_CU_FOR(what, cuMemGetAllocationGranularity, &granularity, &prop,
            CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  RF_CUDA_REQUIRE(granularity > 0 && kAlignment % int64_t(granularity) == 0,
                  std::string("the ") + what + " allocation granularity is " +
                      std::to_string(granularity) + " bytes, which does not divide rankflow's " +
                      std::to_string(kAlignment) + "-byte alignment; this GPU is not supported.");
}

int export_fd(CUmemGenericAllocationHandle h, const std::string& what) {
  int fd = -1;
  RF_CU_FOR("export " + what, cuMemExportToShareableHandle, &fd, h,
            CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  return fd;
}

}  // namespace

ExportedSegments SymmetricMemory::create(int rank, int world, const DeviceContext& dev,
                                         int64_t device_bytes, int64_t host_bytes, MemoryKind kind,
                                         int scaleup_ranks) {
  RF_CUDA_REQUIRE(!created(), "symmetric memory is already created: destroy() it before create().");
  RF_CUDA_REQUIRE(world >= 1 && world <= kMaxRanks && rank >= 0 && rank < world,
                  "rank " + std::to_string(rank) + " of world " + std::to_string(world) +
                      " is out of range (1..64 ranks).");
  RF_CUDA_REQUIRE(scaleup_ranks >= 1 && world % scaleup_ranks == 0,
                  "scaleup_ranks (" + std::to_string(scaleup_ranks) +
                      ") must divide the world size (" + std::to_string(world) + ").");
  RF_CUDA_REQUIRE(device_bytes > 0 && device_bytes % kAlignment == 0,
                  "the device segment (" + std::to_string(device_bytes) +
                      " bytes) must be a positive multiple of 2 MiB: round it with align_up.");
  RF_CUDA_REQUIRE(host_bytes >= 0 && host_bytes % kAlignment == 0,
                  "the host segment (" + std::to_string(host_bytes) +
                      " bytes) must be a multiple of 2 MiB: round it with align_up.");
  RF_CUDA_REQUIRE(kind == MemoryKind::GpuOnly || host_bytes > 0,
                  std::string(memory_kind_name(kind)) + " memory needs host_bytes > 0.");
  RF_CUDA_REQUIRE(dev.supports_posix_fd_vmm(),
                  "GPU " + std::to_string(dev.ordinal()) + " (" + dev.name() +
                      ") lacks virtual memory management with POSIX-fd handles, which symmetric "
                      "memory needs; use backend 'host'.");
  dev.make_current();

  rank_ = rank;
  world_ = world;
  kind_ = kind;
  scaleup_ranks_ = scaleup_ranks;
  device_ordinal_ = dev.ordinal();
  numa_id_ = dev.host_numa_id();
  device_bytes_ = device_bytes;
  host_bytes_ = kind == MemoryKind::GpuOnly ? 0 : host_bytes;
  const int64_t own_host = kind == MemoryKind::Hybrid ? host_bytes_ * scaleup_ranks : host_bytes_;
  stride_ = align_up(device_bytes_ + own_host, kAlignment);
  reserved_bytes_ = stride_ * world;

  const CUmemAllocationProp device_prop = segment_prop(false, device_ordinal_, numa_id_);
  const CUmemAllocationProp host_prop = segment_prop(true, device_ordinal_, numa_id_);
  require_granularity(device_prop, "device segment");
  if (host_bytes_ > 0) require_granularity(host_prop, "host segment");

  const std::string who = "rank " + std::to_string(rank);
  // Memory that cannot be had is the config's doing, not the rank's: EINVAL naming the sizes (as the
  // host backend's mmap failure is), so that createGroup says which option to change.
  const auto too_big = [](const CudaError& e) {
    return e.code == "CUDA_ERROR_OUT_OF_MEMORY" ? CudaError("EINVAL", e.call, std::string("buffer.bytes / buffer.cpuBytes: ") + e.what()) : e;
  };
  try {
    RF_CU_FOR(who + ": reserve " + std::to_string(reserved_bytes_) + " bytes of address space",
              cuMemAddressReserve, &base_, size_t(reserved_bytes_), size_t(kAlignment), 0, 0);
  } catch (const CudaError& e) {
    throw too_big(e);
  }
  try {
    {
      HandleGuard g;
      RF_CU_FOR(who + ": device segment of " + std::to_string(device_bytes_) + " bytes on GPU " +
                    std::to_string(device_ordinal_),
                cuMemCreate, &g.h, size_t(device_bytes_), &device_prop, 0);
      g.live = true;
      device_fd_ = export_fd(g.h, who + " device segment");
      map(window(), device_bytes_, g.h, false, "own device segment");
    }
    if (host_bytes_ > 0) {
      HandleGuard g;
      RF_CU_FOR(who + ": host segment of " + std::to_string(host_bytes_) + " bytes on NUMA node " +
                    std::to_string(numa_id_),
                cuMemCreate, &g.h, size_t(host_bytes_), &host_prop, 0);
      g.live = true;
      host_fd_ = export_fd(g.h, who + " host segment");
      // Elastic: the host segment sits right behind the device one now. Hybrid: at this rank's
      // scale-up slot, mapped with the peers' segments on import.
      if (kind_ == MemoryKind::Elastic) map(window() + device_bytes_, host_bytes_, g.h, true, "own host segment");
    }
  } catch (const CudaError& e) {
    destroy();
    throw too_big(e);
  } catch (...) {
    destroy();
    throw;
  }
  return exported();
}

void SymmetricMemory::map(CUdeviceptr at, int64_t bytes, CUmemGenericAllocationHandle h,
                          bool host_segment, const char* what) {
  const std::string purpose = "rank " + std::to_string(rank_) + " " + what;
  RF_CU_FOR(purpose, cuMemMap, at, size_t(bytes), 0, h, 0);
  mapped_.emplace_back(at, bytes);
  // Only my GPU reads through my reservation: each rank maps its peers itself, so one access
  // descriptor per mapping. A peer GPU's memory needs P2P (NVLink) between the two GPUs.
  CUmemAccessDesc access = {};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device_ordinal_;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  RF_CU_FOR(purpose + ": grant GPU " + std::to_string(device_ordinal_) +
                " access (peer GPUs must be P2P-capable, e.g. NVLink)",
            cuMemSetAccess, at, size_t(bytes), &access, 1);
  if (host_segment) {
    // Let the CPU load and store host segments through the same addresses (engram tables are
    // written by the host). Optional: where the driver refuses it, only GPUs reach the segment.
    CUmemAccessDesc cpu = {};
    cpu.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
    cpu.location.id = numa_id_;
    cpu.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if (driver().cuMemSetAccess(at, size_t(bytes), &cpu, 1) != CUDA_SUCCESS) host_cpu_access_ = false;
  }
}

void SymmetricMemory::map_fd(CUdeviceptr at, int64_t bytes, int fd, bool host_segment,
                             const char* what) {
  RF_CUDA_REQUIRE(fd >= 0, std::string("no fd for the ") + what +
                               ": the peer exported none (GPU-only memory on that rank?). Every "
                               "rank must create the same memory kind.");
  HandleGuard g;
  RF_CU_FOR("rank " + std::to_string(rank_) + " import " + what + " from fd " + std::to_string(fd),
            cuMemImportFromShareableHandle, &g.h,
            reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),
            CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  g.live = true;
  map(at, bytes, g.h, host_segment, what);
}

void SymmetricMemory::import_peers(const std::vector<ExportedSegments>& peers, bool adopt_fds, int share_first,
                                   int share_count, uint64_t live) {
  // Adopted fds are closed whatever happens below: they are ours from the moment we are called.
  struct Closer {
    const std::vector<ExportedSegments>& peers;
    bool adopt;
    int rank;
    ~Closer() {
      if (!adopt) return;
      for (int p = 0; p < int(peers.size()); ++p) {
        if (p == rank) continue;
        if (peers[p].device_fd >= 0) close(peers[p].device_fd);
        if (peers[p].host_fd >= 0) close(peers[p].host_fd);
      }
    }
  } closer{peers, adopt_fds, rank_};

  RF_CUDA_REQUIRE(created(), "import_peers() before create(): create this rank's memory first.");
  RF_CUDA_REQUIRE(!imported_, "peers are already imported into rank " + std::to_string(rank_) + ".");
  RF_CUDA_REQUIRE(int(peers.size()) == world_,
                  "import_peers needs one entry per rank (" + std::to_string(world_) + "), got " +
                      std::to_string(peers.size()) + ".");
  const int share_end = share_count < 0 ? world_ : share_first + share_count;
  RF_CUDA_REQUIRE(share_first >= 0 && share_first <= rank_ && rank_ < share_end && share_end <= world_,
                  "import_peers: the ranks to map [" + std::to_string(share_first) + ", " + std::to_string(share_end) +
                      ") must hold rank " + std::to_string(rank_) + " and lie in the world.");
  const int node = rank_ / scaleup_ranks_;
  for (int p = 0; p < world_; ++p) {
    if (p == rank_ || p < share_first || p >= share_end || !rank_live(live, p)) continue;
    const std::string of = " of rank " + std::to_string(p);
    map_fd(peer_base(p), device_bytes_, peers[p].device_fd, false, ("peer device segment" + of).c_str());
    // A hybrid rank reaches its scale-up peers' host segments through its own window; everything
    // else sits behind the peer's device segment (the stand-in for an RDMA read across nodes).
    if (host_bytes_ > 0 && (kind_ != MemoryKind::Hybrid || p / scaleup_ranks_ != node))
      map_fd(peer_base(p) + device_bytes_, host_bytes_, peers[p].host_fd, true,
             ("peer host segment" + of).c_str());
  }
  if (kind_ == MemoryKind::Hybrid) {
    for (int i = 0; i < scaleup_ranks_; ++i) {
      const int p = node * scaleup_ranks_ + i;
      if (!rank_live(live, p)) continue;
      const int fd = p == rank_ ? host_fd_ : peers[p].host_fd;
      map_fd(window() + device_bytes_ + int64_t(i) * host_bytes_, host_bytes_, fd, true,
             ("scale-up host segment of rank " + std::to_string(p)).c_str());
    }
  }
  imported_ = true;
}

void SymmetricMemory::import_peer(int peer, const ExportedSegments& seg) {
  RF_CUDA_REQUIRE(imported_, "import_peer before the peers were imported");
  RF_CUDA_REQUIRE(peer >= 0 && peer < world_ && peer != rank_, "import_peer: rank " + std::to_string(peer) + " is not a peer");
  const std::string of = " of rank " + std::to_string(peer) + "'s replacement";
  unmap(peer_base(peer));
  map_fd(peer_base(peer), device_bytes_, seg.device_fd, false, ("device segment" + of).c_str());
  if (host_bytes_ == 0) return;
  const CUdeviceptr host = host_segment(peer);
  unmap(host);
  map_fd(host, host_bytes_, seg.host_fd, true, ("host segment" + of).c_str());
}

void SymmetricMemory::unmap(CUdeviceptr at) {
  for (auto it = mapped_.begin(); it != mapped_.end(); ++it) {
    if (it->first != at) continue;
    RF_CU_FOR("rank " + std::to_string(rank_) + " unmap a left rank's segment", cuMemUnmap, at, size_t(it->second));
    mapped_.erase(it);
    return;
  }
}

CUdeviceptr SymmetricMemory::host_segment(int peer) const {
  if (host_bytes_ == 0) return 0;
  if (kind_ == MemoryKind::Hybrid && peer / scaleup_ranks_ == rank_ / scaleup_ranks_)
    return window() + device_bytes_ + CUdeviceptr(int64_t(peer % scaleup_ranks_) * host_bytes_);
  return peer_base(peer) + device_bytes_;
}

std::vector<uint64_t> SymmetricMemory::peer_table() const {
  std::vector<uint64_t> table(static_cast<size_t>(world_));
  for (int p = 0; p < world_; ++p) table[size_t(p)] = uint64_t(peer_base(p));
  return table;
}

void SymmetricMemory::close_exported() noexcept {
  if (device_fd_ >= 0) close(device_fd_);
  if (host_fd_ >= 0) close(host_fd_);
  device_fd_ = host_fd_ = -1;
}

void SymmetricMemory::destroy() noexcept {
  if (base_ != 0) {
    try {
      const Driver& d = driver();
      // Errors are ignored on purpose: after a kernel trap every call on the context fails, and
      // the process must still be able to give back what it can.
      for (auto it = mapped_.rbegin(); it != mapped_.rend(); ++it) d.cuMemUnmap(it->first, size_t(it->second));
      d.cuMemAddressFree(base_, size_t(reserved_bytes_));
    } catch (...) {
    }
  }
  mapped_.clear();
  base_ = 0;
  close_exported();
  imported_ = false;
  host_cpu_access_ = true;
}

}  // namespace rankflow::cuda
