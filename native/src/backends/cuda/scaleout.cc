// The cuda backend's NCCL scale-out leg (scaleout.hpp): grouped ncclSend/ncclRecv over the rank's rail
// communicator.
#include "scaleout.hpp"

#include <dlfcn.h>

#include <mutex>
#include <string>

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

NcclRails::NcclRails(const Nodes& nodes, ncclComm_t comm, CUstream stream)
    : nodes_(nodes), comm_(comm), stream_(stream), p2p_(nccl_p2p()) {
  RF_CHECK(nodes.two_level(), "EINVAL", "scale-out: a world of one node has no rails");
  RF_CHECK(comm != nullptr, "STATE", "scale-out: the rank has no rail communicator (ncclInit first)");
}

void NcclRails::exchange(const std::vector<RailTransfer>& sends, const std::vector<RailTransfer>& recvs) const {
  auto check_node = [&](int node, const char* what) {
    RF_CHECK(node >= 0 && node < nodes_.num_nodes && node != nodes_.node, "EINVAL",
             std::string("scale-out: a ") + what + " for node " + std::to_string(node) + ": rank " +
                 std::to_string(nodes_.rank_of(nodes_.node, nodes_.local)) + " has rail peers on nodes [0, " +
                 std::to_string(nodes_.num_nodes) + ") except its own (" + std::to_string(nodes_.node) + ")");
  };
  // Every peer is checked before anything is enqueued: a refused exchange leaves no half of a group.
  for (const RailTransfer& s : sends) check_node(s.node, "send");
  for (const RailTransfer& r : recvs) check_node(r.node, "receive");
  RF_NCCL(ncclGroupStart);
  try {
    for (const RailTransfer& s : sends)
      if (s.bytes > 0) nccl_check(p2p_.send(reinterpret_cast<const void*>(s.ptr), s.bytes, ncclUint8, s.node, comm_, stream_), "ncclSend", comm_);
    for (const RailTransfer& r : recvs)
      if (r.bytes > 0) nccl_check(p2p_.recv(reinterpret_cast<void*>(r.ptr), r.bytes, ncclUint8, r.node, comm_, stream_), "ncclRecv", comm_);
  } catch (...) {
    nccl().ncclGroupEnd();  // the group must be closed whatever went wrong inside it
    throw;
  }
  nccl_check(nccl().ncclGroupEnd(), "ncclGroupEnd", comm_);
}

void NcclRails::to_every_peer(CUdeviceptr send, int64_t send_stride, CUdeviceptr recv, int64_t recv_stride, size_t bytes,
                              std::vector<RailTransfer>& sends, std::vector<RailTransfer>& recvs) const {
  for (int k = 0; k < nodes_.num_nodes; ++k) {
    if (k == nodes_.node) continue;
    sends.push_back({k, send + CUdeviceptr(send_stride * k), bytes});
    recvs.push_back({k, recv + CUdeviceptr(recv_stride * k), bytes});
  }
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
      if (out > 0) sends.push_back({k, s, out});
      if (in > 0) recvs.push_back({k, r, in});
    }
    s += out, r += in;
  }
  return {sends, recvs};
}

}  // namespace rankflow::cuda
