// Launchers of dispatch.cu and combine.cu: argument checks and cuLaunchKernel parameter lists, which
// must match the kernels' signatures one for one.
#include "moe_launch.hpp"

#include <algorithm>
#include <string>

#include "driver.hpp"
#include "kernel_images.hpp"

namespace rankflow::cuda {
namespace {

constexpr unsigned kNotifyThreads = 1024;  // rf_dispatch_notify's __launch_bounds__
constexpr unsigned kDataThreads = 512;     // rf_dispatch_data's and rf_combine's

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

void check_args(const moe::MoeArgs& a, const char* op) {
  RF_CUDA_REQUIRE(a.peer_table != nullptr, std::string(op) + ": no peer table (upload peer_table() first).");
  RF_CUDA_REQUIRE(a.world >= 1 && a.world <= kMaxRanks && a.rank >= 0 && a.rank < a.world && a.ws.world_size == a.world,
                  std::string(op) + ": rank " + std::to_string(a.rank) + " of world " + std::to_string(a.world) +
                      " is out of range (or the workspace layout is for another world).");
  RF_CUDA_REQUIRE(a.seq != 0, std::string(op) + ": sequence 0 is reserved (an untouched slot).");
  RF_CUDA_REQUIRE(a.topk >= 1 && a.topk <= 32, std::string(op) + ": topk must be 1..32 (a lane per entry).");
  RF_CUDA_REQUIRE(a.experts_per_rank >= 1 && a.num_experts == a.experts_per_rank * a.world,
                  std::string(op) + ": numExperts must be a positive multiple of the world size.");
  RF_CUDA_REQUIRE(a.hidden > 0 && a.hidden % 8 == 0,
                  std::string(op) + ": hidden must be a multiple of 8 (16-byte bf16 row vectors).");
  RF_CUDA_REQUIRE(a.arrivals != nullptr, std::string(op) + ": no arrivals word (a zeroed 4-byte device word).");
}

int blocks_for(int num_sms, int sm_count) {
  const int cap = std::max(1, sm_count);
  return std::max(1, std::min(num_sms > 0 ? num_sms : cap, cap));
}

void check_dispatch(const moe::MoeArgs& a, const moe::DispatchIn& in, const moe::DispatchOut& out) {
  check_args(a, "dispatch");
  RF_CUDA_REQUIRE(in.num_tokens >= 0 && in.num_tokens <= a.max_tokens,
                  "dispatch: x has " + std::to_string(in.num_tokens) + " tokens, above buffer.maxTokensPerRank (" +
                      std::to_string(a.max_tokens) + ")");
  RF_CUDA_REQUIRE(in.x_elem_bytes == 1 || in.x_elem_bytes == 2, "dispatch: x must be bf16 (2 bytes) or fp8 (1 byte).");
  RF_CUDA_REQUIRE((a.hidden * in.x_elem_bytes) % 16 == 0, "dispatch: x rows must be a multiple of 16 bytes.");
  RF_CUDA_REQUIRE(aligned16(in.x) && aligned16(out.x), "dispatch: x and out.x must be 16-byte aligned.");
  RF_CUDA_REQUIRE(in.scales == nullptr || a.buf.scales_per_token > 0,
                  "dispatch: scales given but the buffer was made without fp8 (no scales region).");
  RF_CUDA_REQUIRE(in.num_tokens == 0 || (in.x != nullptr && in.topk_idx != nullptr && in.topk_weights != nullptr),
                  "dispatch: x, topkIdx and topkWeights are required.");
  const bool any = out.x || out.scales || out.topk_idx || out.topk_weights || out.src_rank || out.src_token;
  const bool all = out.x && out.topk_idx && out.topk_weights && out.src_rank && out.src_token &&
                   (in.scales == nullptr || out.scales != nullptr);
  RF_CUDA_REQUIRE(!any || all, "dispatch: give every output (scales only with scales in) or none (outputs stay in the buffer).");
}

}  // namespace

MoeKernels::MoeKernels() {
  try {
    const CUmodule dispatch = load("dispatch");
    notify_ = function(dispatch, "dispatch", "rf_dispatch_notify");
    data_ = function(dispatch, "dispatch", "rf_dispatch_data");
    combine_ = function(load("combine"), "combine", "rf_combine");
  } catch (...) {
    for (CUmodule m : modules_) driver().cuModuleUnload(m);
    throw;
  }
}

MoeKernels::~MoeKernels() {
  // Unload errors (a context poisoned by a trap) cannot be acted on here.
  for (CUmodule m : modules_) driver().cuModuleUnload(m);
}

CUmodule MoeKernels::load(const char* image) {
  const KernelImage* k = find_kernel_image(image);
  if (k == nullptr)
    throw CudaError("BACKEND_UNAVAILABLE", "",
                    std::string("the CUDA kernel '") + image + "' is not in this build: kernels " +
                        kernel_build_note() + ".");
  CUmodule module = nullptr;
  RF_CU_FOR(std::string("load kernel image ") + image + " (" + kernel_build_note() + ")", cuModuleLoadData,
            &module, k->data);
  modules_.push_back(module);
  return module;
}

CUfunction MoeKernels::function(CUmodule module, const char* image, const char* entry) {
  CUfunction f = nullptr;
  RF_CU_FOR(std::string("find ") + entry + " in " + image, cuModuleGetFunction, &f, module, entry);
  return f;
}

moe::MoeArgs moe_args(CUdeviceptr peer_table, int64_t workspace_offset, const WorkspaceLayout& ws,
                      const BufferLayout& buf, const EpConfig& ep, int rank, uint32_t seq,
                      uint64_t timeout_ns, CUdeviceptr diag, CUdeviceptr arrivals) {
  moe::MoeArgs a;
  a.peer_table = reinterpret_cast<const uint64_t*>(peer_table);
  a.workspace_offset = workspace_offset;
  a.buffer_offset = workspace_offset + ws.bytes;
  a.ws = ws;
  a.buf = buf;
  a.rank = rank;
  a.world = ep.world_size;
  a.hidden = int32_t(ep.hidden);
  a.topk = int32_t(ep.topk);
  a.num_experts = int32_t(ep.num_experts);
  a.experts_per_rank = ep.world_size > 0 ? int32_t(ep.num_experts / ep.world_size) : 0;
  a.max_tokens = ep.max_tokens_per_rank;
  a.seq = seq;
  a.timeout_ns = timeout_ns;
  a.diag = reinterpret_cast<Diagnostic*>(diag);
  a.arrivals = reinterpret_cast<unsigned int*>(arrivals);
  return a;
}

void launch_dispatch_notify(const MoeKernels& k, CUstream stream, const moe::MoeArgs& a, CUdeviceptr state,
                            CUdeviceptr topk_idx, int64_t num_tokens, CUdeviceptr host_counts) {
  check_args(a, "dispatch notify");
  RF_CUDA_REQUIRE(num_tokens >= 0 && num_tokens <= a.max_tokens,
                  "dispatch: x has " + std::to_string(num_tokens) + " tokens, above buffer.maxTokensPerRank (" +
                      std::to_string(a.max_tokens) + ")");
  RF_CUDA_REQUIRE(num_tokens == 0 || topk_idx != 0, "dispatch notify: no topkIdx.");
  RF_CUDA_REQUIRE(state != 0, "dispatch notify: no layout state.");
  // Shared memory: a routing mask per token, then a count per expert.
  const int64_t smem = num_tokens * 8 + int64_t(a.num_experts) * 4;
  constexpr int64_t kMaxSmem = 200 * 1024;
  RF_CUDA_REQUIRE(smem <= kMaxSmem, "dispatch notify: " + std::to_string(num_tokens) + " tokens and " +
                                        std::to_string(a.num_experts) +
                                        " experts need more shared memory than one block has; use fewer "
                                        "tokens per dispatch (maxTokensPerRank up to about 24000).");
  if (smem > 48 * 1024)
    RF_CU_FOR("dispatch notify shared memory", cuFuncSetAttribute, k.notify(),
              CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, int(smem));
  moe::MoeArgs args = a;
  moe::MoeState st = moe_state_layout(a).at(state);
  const int32_t* idx = reinterpret_cast<const int32_t*>(topk_idx);
  int64_t n = num_tokens;
  uint64_t* mirror = reinterpret_cast<uint64_t*>(host_counts);
  void* params[] = {&args, &st, &idx, &n, &mirror};
  RF_CU_FOR("dispatch notify, rank " + std::to_string(a.rank), cuLaunchKernel, k.notify(), 1, 1, 1, kNotifyThreads,
            1, 1, unsigned(smem), stream, params, nullptr);
}

bool poll_dispatch_counts(const void* host_counts, int world, int experts_per_rank, uint32_t seq,
                          HostDispatchCounts* out) {
  const uint64_t* words = static_cast<const uint64_t*>(host_counts);
  auto ready = [seq](uint64_t v) { return signal_seq(v) == seq && signal_has_payload(v); };
  auto load = [](const uint64_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); };
  // Rank counts are written last: check them first, then the expert counts are there too.
  for (int p = 0; p < world; ++p)
    if (!ready(load(words + p))) return false;
  for (int64_t i = 0; i < int64_t(world) * experts_per_rank; ++i)
    if (!ready(load(words + world + i))) return false;
  if (out != nullptr) {
    out->recv_count.assign(size_t(world), 0);
    out->tokens_per_expert.assign(size_t(experts_per_rank), 0);
    out->num_recv = 0;
    for (int p = 0; p < world; ++p) {
      out->recv_count[size_t(p)] = decode_count(load(words + p));
      out->num_recv += out->recv_count[size_t(p)];
    }
    for (int p = 0; p < world; ++p)
      for (int e = 0; e < experts_per_rank; ++e)
        out->tokens_per_expert[size_t(e)] += decode_count(load(words + world + int64_t(p) * experts_per_rank + e));
  }
  return true;
}

namespace {
void launch_data(const MoeKernels& k, CUstream stream, const moe::MoeArgs& a, CUdeviceptr state,
                 const moe::DispatchIn& in, const moe::DispatchOut& out, int num_sms, int sm_count, int announce) {
  check_dispatch(a, in, out);
  RF_CUDA_REQUIRE(state != 0, "dispatch: no layout state.");
  moe::MoeArgs args = a;
  moe::MoeState st = moe_state_layout(a).at(state);
  moe::DispatchIn i = in;
  moe::DispatchOut o = out;
  int ann = announce;
  void* params[] = {&args, &st, &i, &o, &ann};
  RF_CU_FOR("dispatch data, rank " + std::to_string(a.rank), cuLaunchKernel, k.data(),
            unsigned(blocks_for(num_sms, sm_count)), 1, 1, kDataThreads, 1, 1, 0, stream, params, nullptr);
}
}  // namespace

void launch_dispatch_data(const MoeKernels& k, CUstream stream, const moe::MoeArgs& a, CUdeviceptr state,
                          const moe::DispatchIn& in, const moe::DispatchOut& out, int num_sms, int sm_count) {
  launch_data(k, stream, a, state, in, out, num_sms, sm_count, 0);
}

void launch_dispatch_cached(const MoeKernels& k, CUstream stream, const moe::MoeArgs& a, CUdeviceptr from_state,
                            CUdeviceptr state, const moe::DispatchIn& in, const moe::DispatchOut& out,
                            int num_sms, int sm_count) {
  RF_CUDA_REQUIRE(from_state != 0 && state != 0, "cached dispatch: no layout state.");
  if (from_state != state)
    RF_CU_FOR("cached dispatch: routing of the cached layout", cuMemcpyAsync, state, from_state,
              size_t(moe_state_layout(a).routing_bytes), stream);
  launch_data(k, stream, a, state, in, out, num_sms, sm_count, 1);
}

moe::DispatchOut dispatch_outputs_in_buffer(const moe::MoeArgs& a, CUdeviceptr my_window, CUdeviceptr state,
                                            bool with_scales) {
  const uint64_t b = my_window + uint64_t(a.buffer_offset - a.workspace_offset);
  moe::DispatchOut o;
  o.x = reinterpret_cast<void*>(b + uint64_t(a.buf.x));
  o.scales = with_scales ? reinterpret_cast<float*>(b + uint64_t(a.buf.scales)) : nullptr;
  o.topk_idx = reinterpret_cast<int32_t*>(b + uint64_t(a.buf.topk_idx));
  o.topk_weights = reinterpret_cast<float*>(b + uint64_t(a.buf.topk_weights));
  o.src_token = reinterpret_cast<int32_t*>(b + uint64_t(a.buf.src_token));
  o.src_rank = moe_state_layout(a).at(state).recv_src_rank;
  return o;
}

void launch_combine(const MoeKernels& k, CUstream stream, const moe::MoeArgs& a, CUdeviceptr state,
                    const moe::CombineIn& in, const moe::CombineOut& out, int num_sms, int sm_count,
                    int send_blocks) {
  check_args(a, "combine");
  RF_CUDA_REQUIRE(state != 0, "combine: no layout state.");
  RF_CUDA_REQUIRE(in.num_tokens >= 0 && in.num_tokens <= a.max_tokens, "combine: num_tokens out of range.");
  RF_CUDA_REQUIRE(aligned16(in.x) && aligned16(in.bias0) && aligned16(in.bias1) && aligned16(out.x),
                  "combine: x, the biases and out.x must be 16-byte aligned.");
  RF_CUDA_REQUIRE(in.num_tokens == 0 || (out.x != nullptr && out.topk_weights != nullptr),
                  "combine: out.x and out.topkWeights are required.");
  moe::MoeArgs args = a;
  moe::MoeState st = moe_state_layout(a).at(state);
  moe::CombineIn i = in;
  moe::CombineOut o = out;
  const int blocks = blocks_for(num_sms, sm_count);
  int split = send_blocks < 0 ? std::max(1, blocks / 3) : send_blocks;  // 1/3: best at 24 and 132 SMs
  if (blocks < 2 || a.world < 2 || !moe::combine_flags_fit(a.buf)) split = 0;
  split = std::min(split, blocks - 1);
  void* params[] = {&args, &st, &i, &o, &split};
  RF_CU_FOR("combine, rank " + std::to_string(a.rank), cuLaunchKernel, k.combine(), unsigned(blocks), 1, 1,
            kDataThreads, 1, 1, 0, stream, params, nullptr);
}

}  // namespace rankflow::cuda
