// Asynchronous AGRS collectives and engram fetches on the host executor (Backend::agrs_issue, ...).
// A collective's issue does what the synchronous one (agrs.cc) does before its wait: my part into
// every peer's region (into none of mine when the input is in place: my slot already holds it) and
// the done signals; complete() waits for the peers' done and, for a reduceScatter, sums the arrived
// chunks in place, at the start of the region. So the peers' writes land while the rank goes on.
// Across nodes a collective runs whole at issue instead (HostTwoLevel::agrs_issue), complete() returns.
// A fetch involves no peer, only copies out of the mapped host segments: for it to overlap with the
// rank's work it must run on another thread (done eagerly, wait() would only return), so it runs on
// the rank's fetch thread (runtime/executor.hpp), and complete() waits for its flag.
#include <atomic>
#include <cstring>
#include <limits>

#include "backend.hpp"

namespace rankflow::host {

namespace {

struct FetchState final : AsyncState {
  std::shared_ptr<std::atomic<bool>> done;
};

}  // namespace

void HostBackend::agrs_issue(AgrsOp& op) {
  const uint8_t* src = host_ptr(op.in, op.reduce ? "reduceScatter input" : "allGather input");
  const int W = world();
  if (!op.reduce) {
    const int64_t mine = op.at + int64_t(rank()) * op.bytes;
    uint8_t* slot = buffer() + mine;
    if (src != slot && op.bytes > 0) std::memcpy(slot, src, size_t(op.bytes));  // copied in: not in place
    for (int i = 1; i < W; ++i) {
      const int p = (rank() + i) % W;
      std::memcpy(peer_buffer(p) + mine, slot, size_t(op.bytes));
      signal(peer_slot(p, c_.ws.done), op.seq);
    }
    return;
  }
  // Chunk q of my input goes to rank q's region, at my rank's slot.
  const int64_t chunk = op.bytes;
  for (int i = 0; i < W; ++i) {
    const int q = (rank() + i) % W;
    uint8_t* dst = (q == rank() ? buffer() : peer_buffer(q)) + op.at + int64_t(rank()) * chunk;
    std::memcpy(dst, src + int64_t(q) * chunk, size_t(chunk));
    if (q != rank()) signal(peer_slot(q, c_.ws.done), op.seq);
  }
}

void HostBackend::agrs_complete(AgrsOp& op) {
  wait_all(c_.ws.done, op.seq, op.reduce ? kPhaseSessionReduce : kPhaseSessionGather, "done", WaitKind::Device, op.seq);
  if (!op.reduce) return;
  // The sum of element i over ranks in rank order (as the CUDA kernel), written over part 0's
  // element i once all W parts of it are read.
  uint8_t* region = buffer() + op.at;
  const int64_t chunk = op.bytes;
  for (int64_t i = 0; i < op.n; ++i) {
    float acc = 0.0f;
    for (int q = 0; q < world(); ++q) {
      const uint8_t* part = region + int64_t(q) * chunk;
      acc += op.bf16 ? bf16_to_float(reinterpret_cast<const uint16_t*>(part)[i]) : reinterpret_cast<const float*>(part)[i];
    }
    if (op.bf16) reinterpret_cast<uint16_t*>(region)[i] = float_to_bf16(acc);
    else reinterpret_cast<float*>(region)[i] = acc;
  }
}

void HostBackend::engram_fetch_issue(FetchOp& op) {
  RF_CHECK(!op.out.device, "EINVAL", "engramFetch output: device tensors need backend 'cuda'");
  if (!fetcher_) fetcher_ = std::make_unique<Executor>();
  auto state = std::make_unique<FetchState>();
  state->done = std::make_shared<std::atomic<bool>>(false);
  // The op (ids, out) outlives the job: it is freed after complete() saw the flag, or after destroy()
  // stopped this thread. The segments stay mapped until then too.
  fetcher_->post([this, ids = op.ids.data(), n = int64_t(op.ids.size()), entries = op.entries, row = op.row_bytes,
                  out = op.out.as<uint8_t>(), done = state->done] {
    for (int64_t i = 0; i < n; ++i) {
      const int64_t g = ids[i];
      std::memcpy(out + i * row, mem_.host_segment(int(g / entries)) + (g % entries) * row, size_t(row));
    }
    done->store(true, std::memory_order_release);
  });
  op.state = std::move(state);
}

void HostBackend::engram_fetch_complete(FetchOp& op) {
  const auto* state = static_cast<const FetchState*>(op.state.get());
  // Local copies that always end: no deadline, and no abort (the op's memory must outlive the job).
  WaitRules r = c_.rules;
  r.abort = nullptr;
  r.gpu_timeout_s = std::numeric_limits<double>::infinity();
  wait_until(r, WaitSite{kPhaseEngram, -1, "fetch"}, WaitKind::Device,
             [&] { return state->done->load(std::memory_order_acquire); }, [] { return uint64_t(0); });
}

}  // namespace rankflow::host
