// The operations of a rank, as the runtime runs them: each checks its inputs once (the same checks
// for every backend, with messages that name the argument and say what to do), assigns the op's
// sequence number, keeps the protocol state (layouts, session, engram table) and calls the Backend.
// One file per operation in runtime/ops/.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "context.hpp"

namespace rankflow::ops {

// Maps every peer's window, then a barrier: every window is mapped before anyone writes into one.
void register_window(Context& c, const std::vector<ExportedSegments>& peers);

// barrier: the device round (a new seq), then with cpu_sync the CPUs' round under the same seq.
void barrier(Context& c, bool cpu_sync);

// allGather outside a session: out (W * bytes) = every rank's `bytes` in rank order.
void all_gather(Context& c, Mem in, int64_t bytes, Mem out);

// allReduce: out (n fp32 or bf16 elements; in == out allowed) = the sum over ranks of their `in`, in
// rank order with fp32 accumulation: the same bits on every rank, within a node and across nodes.
void all_reduce(Context& c, Mem in, Mem out, int64_t n, bool bf16);

// dispatch, in the steps the binding may split when the CPU-sync wait is slow:
//   begin (checks, notify or the handle's routing) -> counts (the CPU-sync wait) -> finish (data).
// cpu_sync = false (outputs in the buffer, cuda): counts is skipped.
std::shared_ptr<DispatchLayout> dispatch_begin(Context& c, const DispatchInput& in);
bool dispatch_counts(Context& c, DispatchLayout& l, bool block);
void dispatch_finish(Context& c, DispatchLayout& l, const DispatchInput& in, DispatchOutput& out);
// tokensPerExpert as the API returns it, into out[0, experts per rank): each count padded to the
// layout's expertAlignment.
void aligned_tokens_per_expert(const DispatchLayout& l, double* out);
// The live layout a handle names, or EINVAL naming `what`.
std::shared_ptr<DispatchLayout> handle_layout(const Context& c, uint32_t handle, const char* what);

void combine(Context& c, uint32_t handle, const CombineInput& in, const CombineOutput& out);

// AGRS sessions (seed 6.3).
void session_open(Context& c, int64_t max_bytes, int64_t max_all_gathers);
void session_close(Context& c);
void session_all_gather(Context& c, Mem in, int64_t bytes, Mem out);
// in: [W * n] fp32 or bf16; out[n] = sum over ranks of their rows [rank*n, (rank+1)*n), fp32 accumulation.
void session_reduce_scatter(Context& c, Mem in, int64_t n, bool bf16, Mem out);

// ---- session tensors and asynchronous ops (runtime/ops/inflight.cc; runtime/inflight.hpp) ----
// Reserves a fresh region of `bytes` in the open session (one of its maxAllGathers), recording it;
// slot_bytes > 0: the region of a session tensor of that many bytes per rank. Its buffer offset.
int64_t session_reserve(Context& c, int64_t bytes, const char* op, int64_t slot_bytes = 0);
// A session tensor of `bytes` per rank: a region of W * bytes; the buffer offset of my slot in it.
int64_t session_tensor(Context& c, int64_t bytes);
// STATE for an input that overlaps a session region a collective in flight still writes.
void check_input_ready(Context& c, Mem in, int64_t bytes, const char* what);
// Starts a session allGather (bytes per rank) or reduceScatter (n elements per chunk) of `in`: in
// place, with no local copy, when `in` is my slot of a session tensor not gathered yet. Its id; the
// buffer offset of its result in *result_at (allGather: the W parts; reduceScatter: the n sums).
uint64_t session_issue(Context& c, bool reduce, Mem in, int64_t bytes_or_n, bool bf16, int64_t* result_at);
// Starts an engram fetch of ids[n] (range-checked, copied); its id. The rows go to memory of the op
// (host: InFlightOp::host_out) or, on cuda, to device memory whose address is put in *device_out.
uint64_t engram_fetch_issue(Context& c, const int32_t* ids, int64_t n, uint64_t* device_out);
// Waits for op `id` (STATE if it is not in flight: never issued, or waited for already); the op, done.
std::unique_ptr<InFlightOp> inflight_wait(Context& c, uint64_t id);

// engram: a table in the host segment, fetched by global row id (ids in host memory, range-checked).
void engram_write(Context& c, Mem table, int64_t entries, int64_t row_bytes);
void engram_fetch(Context& c, const int32_t* ids, int64_t n, Mem out);
// EINVAL naming indices[i] for an id outside the table or, in a world of more than one node, an entry
// of another node's rank (its host segment is not mapped here).
void check_engram_ids(const Context& c, const int32_t* ids, int64_t n);

// pipeline: send to rank + 1, receive from rank - 1 (ring).
void pp_exchange(Context& c, Mem in, int64_t bytes, Mem out);

// After a run's release (a rank program threw, or returned while its peers waited), once every rank's
// program has ended: this rank's ops in flight are waited for (their released waits end at once), its
// session closed, and its sequence number and session count set to the ones the group agreed on
// (above every number a rank used, so no signal left in a slot can satisfy a later wait).
void recover(Context& c, uint64_t seq, uint32_t session_index);

// CUDA graphs of no-CPU-sync ops: begin, the ops, end -> a graph id; each replay is new collectives.
void capture_begin(Context& c);
uint64_t capture_end(Context& c, int64_t* ops);
void replay(Context& c, uint64_t graph, int64_t ops);

// ---- elastic groups (runtime/ops/membership.cc) ----
// A rank left (or several did): once every survivor's ops ended (the left word ended them), this
// rank recovers to the group's numbers (as after a run's release: recover above) and writes the new
// membership `mask` (epoch: the group's count of changes) into its workspace, where its ops read it.
void remask(Context& c, uint64_t seq, uint32_t session_index, uint64_t mask, uint64_t epoch);
// Replacements of ranks `peers` joined (one rank's replaceRank, or a process's range rejoining a
// world): each window is mapped over the old one, the membership gains them, the engram table is
// forgotten (a replacement's host segment holds none), and one barrier with the replacements (which
// register at the same seq) ends it.
void rejoin(Context& c, const std::vector<int>& peers, const std::vector<ExportedSegments>& segs, uint64_t mask, uint64_t epoch);

}  // namespace rankflow::ops
