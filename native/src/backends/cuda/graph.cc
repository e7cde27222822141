// CUDA graphs of a rank's no-CPU-sync ops (ops/graph.cc): captured on the rank's stream with their
// sequence numbers relative to a device epoch; the graph's last node advances the epoch by the
// graph's op count, so back-to-back replays need nothing from the host; when other ops ran in between,
// the replay first sets the epoch (two stream-ordered memsets, values passed by value). Also the
// tests' SM occupier.
#include "backend.hpp"
#include "driver.hpp"
#include "faults.hpp"

namespace rankflow::cuda {

void CudaBackend::capture_begin(uint64_t seq) {
  check_alive("capture");
  RF_CHECK(!capturing_, "STATE", "capture: a capture is already in progress on this rank");
  capture_ = Graph{};
  capture_base_ = seq;
  // Relaxed: the ranks of a process capture at the same time on their own threads, and a layout's
  // device memory may be allocated (not captured) while capturing.
  translating(rank(), [&] { RF_CU(cuStreamBeginCapture, stream_, CU_STREAM_CAPTURE_MODE_RELAXED); });
  capturing_ = true;
  launch_->capturing(true);
  pool_.begin_capture();
}

uint64_t CudaBackend::capture_end(uint64_t ops) {
  RF_CHECK(capturing_, "STATE", "capture: no capture is in progress on this rank");
  const Driver& d = driver();
  CUresult launched = CUDA_SUCCESS;
  if (ops > 0) {
    try {
      kargs::EpochArgs e;
      e.epoch = reinterpret_cast<uint64_t*>(epoch_);
      e.advance = ops;
      launch_->epoch_advance(stream_, e);
    } catch (const CudaError&) {
      launched = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    }
  }
  CUgraph g = nullptr;
  const CUresult ended = d.cuStreamEndCapture(stream_, &g);
  capturing_ = false;
  launch_->capturing(false);
  translating(rank(), [&] { pool_.end_capture(); });
  Graph graph = std::move(capture_);
  capture_ = Graph{};
  if (ended != CUDA_SUCCESS || launched != CUDA_SUCCESS || g == nullptr) {
    if (g != nullptr) d.cuGraphDestroy(g);
    for (const CUdeviceptr p : graph.outputs) pool_.free(p);
    throw Error("EINVAL", "capture: the captured function's ops could not be recorded (" + error_name(ended) +
                              "): capture only ops that need no CPU sync (cached dispatch with outputsInBuffer, combine, "
                              "barrier, allGather of device tensors) on fixed shapes");
  }
  graph.graph = g;
  graph.ops = ops;
  translating(rank(), [&] { RF_CU(cuGraphInstantiateWithFlags, &graph.exec, g, 0); });
  const uint64_t id = next_graph_++;
  graphs_.emplace(id, std::move(graph));
  return id;
}

void CudaBackend::replay(uint64_t graph, uint64_t seq) {
  check_alive("replay");
  const auto it = graphs_.find(graph);
  RF_CHECK(it != graphs_.end(), "EINVAL", "replay: not a live graph of rank " + std::to_string(rank()));
  // Its allReduce would wait for a rank that left until the GPU timeout: refused, as the op itself is.
  if (it->second.needs_all && !c_.whole())
    throw Error("RANK_FAILED", "replay: the graph holds an allReduce, which needs every rank, and ranks left the group; "
                               "it replays again once the group is 'ready' (group.replaceRank)", rank(), "replay");
  translating(rank(), [&] {
    if (epoch_value_ != seq) {  // other ops ran since the last replay: the epoch starts at the rank's seq
      RF_CU(cuMemsetD32Async, epoch_, unsigned(seq & 0xffffffffu), 1, stream_);
      RF_CU(cuMemsetD32Async, epoch_ + 4, unsigned(seq >> 32), 1, stream_);
    }
    RF_CU(cuGraphLaunch, it->second.exec, stream_);
  });
  epoch_value_ = seq + it->second.ops;
}

void CudaBackend::free_graph(uint64_t graph) {
  const auto it = graphs_.find(graph);
  if (it == graphs_.end()) return;
  const Driver& d = driver();
  d.cuStreamSynchronize(stream_);  // a replay may still run
  if (it->second.exec != nullptr) d.cuGraphExecDestroy(it->second.exec);
  if (it->second.graph != nullptr) d.cuGraphDestroy(it->second.graph);
  for (const CUdeviceptr p : it->second.outputs) {
    try {
      pool_.free(p);
    } catch (...) {
    }
  }
  graphs_.erase(it);
}

void CudaBackend::occupy(int sms, double ms) {
  check_alive("occupy");
  translating(rank(), [&] {
    if (busy_stream_ == nullptr) RF_CU(cuStreamCreate, &busy_stream_, CU_STREAM_NON_BLOCKING);
    kargs::BusyArgs b;
    b.ns = uint64_t(ms * 1e6);
    launch_->busy(busy_stream_, b, sms);
  });
}

}  // namespace rankflow::cuda
