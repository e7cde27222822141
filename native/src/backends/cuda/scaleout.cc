// The cuda backend's NCCL scale-out leg (see scaleout.hpp: compiled, never run).
#include "scaleout.hpp"

#include <dlfcn.h>

#include <mutex>

namespace rankflow::cuda {

const NcclP2p& nccl_p2p() {
  static NcclP2p p;
  static std::string error;
  static std::once_flag once;
  std::call_once(once, [] {
    const Nccl& n = nccl();  // loads NCCL, or throws saying why not
    void* handle = dlopen(n.library.c_str(), RTLD_NOW | RTLD_NOLOAD | RTLD_LOCAL);
    if (handle != nullptr) {
      p.send = reinterpret_cast<decltype(p.send)>(dlsym(handle, "ncclSend"));
      p.recv = reinterpret_cast<decltype(p.recv)>(dlsym(handle, "ncclRecv"));
      dlclose(handle);  // NOLOAD took a reference of the library nccl() keeps loaded
    }
    if (p.send == nullptr || p.recv == nullptr) error = "NCCL at " + n.library + " has no ncclSend/ncclRecv";
  });
  RF_CHECK(error.empty(), "BACKEND_UNAVAILABLE", error);
  return p;
}

NcclRails::NcclRails(const Nodes& nodes, ncclComm_t comm, CUstream stream) : nodes_(nodes), comm_(comm), stream_(stream) {
  RF_CHECK(nodes.two_level(), "EINVAL", "scale-out: a world of one node has no rails");
  RF_CHECK(comm != nullptr, "STATE", "scale-out: the rank has no NCCL communicator");
}

void NcclRails::exchange(const std::vector<RailTransfer>& sends, const std::vector<RailTransfer>& recvs) const {
  const NcclP2p& p2p = nccl_p2p();
  auto check_peer = [&](int peer) {
    RF_CHECK(peer >= 0 && !nodes_.same_node(peer) && nodes_.local_of(peer) == nodes_.local, "EINVAL",
             "scale-out: rank " + std::to_string(peer) + " is not a rail peer of this rank");
  };
  RF_NCCL(ncclGroupStart);
  try {
    for (const RailTransfer& s : sends) {
      check_peer(s.peer);
      nccl_check(p2p.send(reinterpret_cast<const void*>(s.ptr), s.bytes, ncclUint8, s.peer, comm_, stream_), "ncclSend", comm_);
    }
    for (const RailTransfer& r : recvs) {
      check_peer(r.peer);
      nccl_check(p2p.recv(reinterpret_cast<void*>(r.ptr), r.bytes, ncclUint8, r.peer, comm_, stream_), "ncclRecv", comm_);
    }
  } catch (...) {
    nccl().ncclGroupEnd();  // the group must be closed whatever went wrong inside it
    throw;
  }
  RF_NCCL(ncclGroupEnd);
}

void NcclRails::exchange_counts(CUdeviceptr mine, CUdeviceptr theirs) const {
  std::vector<RailTransfer> sends, recvs;
  for (int k = 0; k < nodes_.num_nodes; ++k) {
    if (k == nodes_.node) continue;
    sends.push_back({nodes_.rail_peer(k), mine + CUdeviceptr(k) * 8, 8});
    recvs.push_back({nodes_.rail_peer(k), theirs + CUdeviceptr(k) * 8, 8});
  }
  exchange(sends, recvs);
}

std::pair<std::vector<RailTransfer>, std::vector<RailTransfer>> NcclRails::record_transfers(
    const std::vector<int64_t>& send_counts, const std::vector<int64_t>& recv_counts, int64_t record_bytes, CUdeviceptr send_buf,
    CUdeviceptr recv_buf) const {
  RF_CHECK(int(send_counts.size()) == nodes_.num_nodes && int(recv_counts.size()) == nodes_.num_nodes, "EINVAL",
           "scale-out: record counts need one entry per node");
  std::vector<RailTransfer> sends, recvs;
  CUdeviceptr s = send_buf, r = recv_buf;
  for (int k = 0; k < nodes_.num_nodes; ++k) {
    const size_t out = size_t(send_counts[size_t(k)] * record_bytes), in = size_t(recv_counts[size_t(k)] * record_bytes);
    if (k != nodes_.node) {
      if (out > 0) sends.push_back({nodes_.rail_peer(k), s, out});
      if (in > 0) recvs.push_back({nodes_.rail_peer(k), r, in});
    }
    s += out, r += in;
  }
  return {sends, recvs};
}

}  // namespace rankflow::cuda
