// Host symmetric memory: memfd segments mapped MAP_SHARED into one flat reservation per rank.
#include "symmetric.hpp"

#include <sys/mman.h>

#include <cstring>
#include <unistd.h>

#include "runtime/errors.hpp"
#include "protocol.hpp"

namespace rankflow {

namespace {

int make_memfd(const std::string& name, int64_t bytes) {
  const int fd = memfd_create(name.c_str(), MFD_CLOEXEC);
  if (fd < 0) throw sys_error("memfd_create(" + name + ")");
  if (ftruncate(fd, bytes) != 0) {
    const Error e = sys_error("ftruncate(" + name + ", " + std::to_string(bytes) + ")");
    close(fd);
    throw e;
  }
  return fd;
}

void map_fixed(uint8_t* at, int64_t bytes, int fd, const char* what) {
  void* p = mmap(at, size_t(bytes), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
  if (p == MAP_FAILED) throw sys_error(std::string("mmap(") + what + ")");
}

}  // namespace

void HostSymmetricMemory::create(int rank, int world, int64_t device_bytes, int64_t host_bytes, MemoryKind kind,
                                 int scaleup_ranks) {
  RF_CHECK(device_bytes > 0 && device_bytes % kAlignment == 0, "EINVAL", "device segment must be a positive multiple of 2 MiB");
  RF_CHECK(host_bytes % kAlignment == 0, "EINVAL", "host segment must be a multiple of 2 MiB");
  rank_ = rank;
  world_ = world;
  kind_ = kind;
  scaleup_ranks_ = scaleup_ranks;
  device_bytes_ = device_bytes;
  host_bytes_ = kind == MemoryKind::GpuOnly ? 0 : host_bytes;
  const int64_t own_host = kind == MemoryKind::Hybrid ? host_bytes_ * scaleup_ranks : host_bytes_;
  stride_ = align_up(device_bytes_ + own_host, kAlignment);
  reserved_bytes_ = stride_ * world + kAlignment;
  void* r = mmap(nullptr, size_t(reserved_bytes_), PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (r == MAP_FAILED)
    throw Error("EINVAL", "buffer.bytes / buffer.cpuBytes: cannot reserve " + std::to_string(reserved_bytes_) +
                              " bytes of address space for the symmetric windows (mmap: " + std::strerror(errno) + ")");
  reservation_ = static_cast<uint8_t*>(r);
  base_ = reinterpret_cast<uint8_t*>(align_up(reinterpret_cast<int64_t>(reservation_), kAlignment));
  try {
    device_fd_ = make_memfd("rankflow-r" + std::to_string(rank) + "-device", device_bytes_);
    map_fixed(window(), device_bytes_, device_fd_, "own device segment");
    if (host_bytes_ > 0) {
      host_fd_ = make_memfd("rankflow-r" + std::to_string(rank) + "-host", host_bytes_);
      // Elastic: the host segment sits right behind the device one now. Hybrid: at this rank's scale-up
      // slot, mapped with the peers' segments on import.
      if (kind == MemoryKind::Elastic) map_fixed(window() + device_bytes_, host_bytes_, host_fd_, "own host segment");
    }
  } catch (...) {
    destroy();
    throw;
  }
}

void HostSymmetricMemory::import_peers(const std::vector<ExportedSegments>& peers, int share_first, int share_count, uint64_t live) {
  RF_CHECK(int(peers.size()) == world_, "EINVAL", "import_peers needs one entry per rank");
  RF_CHECK(!imported_, "STATE", "peers are already imported");
  const int node = rank_ / scaleup_ranks_;
  const int share_end = share_count < 0 ? world_ : share_first + share_count;
  for (int p = 0; p < world_; ++p) {
    if (p == rank_ || p < share_first || p >= share_end || !rank_live(live, p)) continue;
    RF_CHECK(peers[p].device_fd >= 0, "EINVAL", "rank " + std::to_string(p) + " exported no device segment");
    map_fixed(peer_window(p), device_bytes_, peers[p].device_fd, "peer device segment");
    if (host_bytes_ > 0) {
      RF_CHECK(peers[p].host_fd >= 0, "EINVAL", "rank " + std::to_string(p) + " exported no host segment");
      // A hybrid rank reaches its scale-up peers' host segments through its own window; everything else
      // sits behind the peer's device segment (the stand-in for an RDMA read across nodes).
      if (kind_ != MemoryKind::Hybrid || p / scaleup_ranks_ != node) map_fixed(peer_window(p) + device_bytes_, host_bytes_, peers[p].host_fd, "peer host segment");
    }
  }
  if (kind_ == MemoryKind::Hybrid) {
    for (int i = 0; i < scaleup_ranks_; ++i) {
      const int p = node * scaleup_ranks_ + i;
      if (!rank_live(live, p)) continue;
      const int fd = p == rank_ ? host_fd_ : peers[p].host_fd;
      map_fixed(window() + device_bytes_ + int64_t(i) * host_bytes_, host_bytes_, fd, "scale-up host segment");
    }
  }
  imported_ = true;
}

void HostSymmetricMemory::import_peer(int peer, const ExportedSegments& seg) {
  RF_CHECK(imported_, "STATE", "import_peer before the peers were imported");
  RF_CHECK(peer >= 0 && peer < world_ && peer != rank_, "EINVAL", "import_peer: rank " + std::to_string(peer) + " is not a peer");
  RF_CHECK(seg.device_fd >= 0, "EINVAL", "rank " + std::to_string(peer) + "'s replacement exported no device segment");
  RF_CHECK(host_bytes_ == 0 || seg.host_fd >= 0, "EINVAL", "rank " + std::to_string(peer) + "'s replacement exported no host segment");
  // MAP_FIXED over the old rank's mapping: its pages stay only as long as nothing else maps them.
  map_fixed(peer_window(peer), device_bytes_, seg.device_fd, "replacement device segment");
  if (host_bytes_ == 0) return;
  const int node = rank_ / scaleup_ranks_;
  if (kind_ == MemoryKind::Hybrid && peer / scaleup_ranks_ == node)
    map_fixed(window() + device_bytes_ + int64_t(peer % scaleup_ranks_) * host_bytes_, host_bytes_, seg.host_fd, "replacement scale-up host segment");
  else
    map_fixed(peer_window(peer) + device_bytes_, host_bytes_, seg.host_fd, "replacement host segment");
}

uint8_t* HostSymmetricMemory::host_segment(int peer) const {
  if (host_bytes_ == 0) return nullptr;
  if (kind_ == MemoryKind::Hybrid && peer / scaleup_ranks_ == rank_ / scaleup_ranks_)
    return window() + device_bytes_ + int64_t(peer % scaleup_ranks_) * host_bytes_;
  return peer_window(peer) + device_bytes_;
}

void HostSymmetricMemory::destroy() {
  if (reservation_ != nullptr) {
    munmap(reservation_, size_t(reserved_bytes_));
    reservation_ = base_ = nullptr;
  }
  if (device_fd_ >= 0) close(device_fd_);
  if (host_fd_ >= 0) close(host_fd_);
  device_fd_ = host_fd_ = -1;
  imported_ = false;
}

}  // namespace rankflow
