// The CUDA backend's error translation and the process-wide fault registry (faults.hpp).
#include "faults.hpp"

#include <mutex>

namespace rankflow::cuda {

namespace {
std::mutex g_mutex;
int g_rank = -1;
std::string g_what;
}  // namespace

void record_fault(int rank, const std::string& what) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_rank >= 0) return;
  g_rank = rank;
  g_what = what;
}

int faulted_elsewhere(int rank, std::string* note) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_rank < 0 || g_rank == rank) return -1;
  *note = " Not this rank's doing: " + g_what +
          " in this process, and CUDA's launch failures are sticky for the whole process, so every rank's "
          "context in it is dead (on every GPU): destroy the group. Ranks in separate processes "
          "(createGroup({ world })) keep their GPUs when one of them faults";
  return g_rank;
}

Error to_error(const CudaError& e, int rank) {
  if (e.code == "EINVAL" || e.code == "BACKEND_UNAVAILABLE" || e.code == "STATE") return Error(e.code, e.what());
  std::string note;
  const int culprit = faulted_elsewhere(rank, &note);
  return Error("RANK_FAILED", "rank " + std::to_string(rank) + ": " + e.what() + note, culprit >= 0 ? culprit : rank);
}

}  // namespace rankflow::cuda
