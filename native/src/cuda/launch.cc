// Launchers of barrier.cu and all_gather.cu: argument checks and the cuLaunchKernel parameter lists,
// which must match the kernels' signatures one for one.
#include "launch.hpp"

#include <algorithm>
#include <string>

#include "driver.hpp"
#include "kernels.hpp"

namespace rankflow::cuda {
namespace {

void check_signal_args(const SignalArgs& a, const char* op) {
  RF_CUDA_REQUIRE(a.peer_table != 0, std::string(op) + ": no peer table (upload peer_table() first).");
  RF_CUDA_REQUIRE(a.ws.world_size >= 1 && a.ws.world_size <= kMaxRanks && a.rank >= 0 &&
                      a.rank < a.ws.world_size,
                  std::string(op) + ": rank " + std::to_string(a.rank) + " of world " +
                      std::to_string(a.ws.world_size) + " is out of range.");
  RF_CUDA_REQUIRE(a.seq != 0, std::string(op) + ": sequence 0 is reserved (an untouched slot).");
}

}  // namespace

void launch_barrier(const Kernels& k, CUstream stream, const SignalArgs& a) {
  check_signal_args(a, "barrier");
  // Copies: cuLaunchKernel reads the values behind these pointers at the call.
  CUdeviceptr peers = a.peer_table, diag = a.diag;
  int64_t workspace_offset = a.workspace_offset;
  WorkspaceLayout ws = a.ws;
  int rank = a.rank;
  uint32_t seq = a.seq;
  uint64_t timeout_ns = a.timeout_ns;
  void* params[] = {&peers, &workspace_offset, &ws, &rank, &seq, &timeout_ns, &diag};
  RF_CU_FOR("barrier, rank " + std::to_string(rank), cuLaunchKernel, k.barrier(), 1, 1, 1,
            unsigned(kMaxRanks), 1, 1, 0, stream, params, nullptr);
}

void launch_all_gather(const Kernels& k, CUstream stream, const SignalArgs& a, CUdeviceptr src,
                       int64_t bytes, int64_t dst_offset, CUdeviceptr arrivals, int num_blocks,
                       int sm_count) {
  check_signal_args(a, "allGather");
  RF_CUDA_REQUIRE(bytes > 0 && bytes % 16 == 0 && src % 16 == 0 && dst_offset % 16 == 0,
                  "allGather: bytes (" + std::to_string(bytes) +
                      "), the source address and dst_offset must be multiples of 16 (16-byte "
                      "vector copies); pad the rows.");
  RF_CUDA_REQUIRE(arrivals != 0, "allGather: no arrivals word (a zeroed 4-byte device word).");
  constexpr int kThreads = 256;
  constexpr int64_t kBytesPerBlock = int64_t(256) << 10;  // below this, more blocks only add arrivals
  const int cap = std::max(1, sm_count);
  int blocks = num_blocks > 0 ? num_blocks
                              : int(std::min<int64_t>(cap, (bytes * a.ws.world_size + kBytesPerBlock - 1) / kBytesPerBlock));
  blocks = std::max(1, std::min(blocks, cap));
  CUdeviceptr peers = a.peer_table, diag = a.diag, source = src, counter = arrivals;
  int64_t workspace_offset = a.workspace_offset, n = bytes, dst = dst_offset;
  WorkspaceLayout ws = a.ws;
  int rank = a.rank;
  uint32_t seq = a.seq;
  uint64_t timeout_ns = a.timeout_ns;
  void* params[] = {&peers, &workspace_offset, &ws, &source, &n, &dst, &counter, &rank, &seq, &timeout_ns, &diag};
  RF_CU_FOR("allGather, rank " + std::to_string(rank), cuLaunchKernel, k.all_gather(), unsigned(blocks),
            1, 1, unsigned(kThreads), 1, 1, 0, stream, params, nullptr);
}

}  // namespace rankflow::cuda
