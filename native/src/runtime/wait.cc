// The errors of the one wait (wait.hpp), and the phase names they use.
#include "wait.hpp"

#include <cstdio>

namespace rankflow {

const char* phase_name(uint64_t phase) {
  static constexpr const char* kNames[] = {
#define RF_PHASE_NAME(id, name) name,
      RF_PHASES(RF_PHASE_NAME)
#undef RF_PHASE_NAME
  };
  return phase < kPhaseCount ? kNames[phase] : "none";
}

namespace {
std::string counter_text(const WaitSite& site) {
  std::string counter = site.counter;
  if (site.peer >= 0) counter += "[from rank " + std::to_string(site.peer) + "]";
  if (site.index >= 0) counter += "[" + std::to_string(site.index) + "]";
  return counter;
}
}  // namespace

Error abort_error(const WaitRules& r, const WaitSite& site) {
  const int failed = r.abort != nullptr ? r.abort->failed_rank() : -1;
  if (failed >= 0) {
    const std::string where = "rank " + std::to_string(r.rank) + " waited in " + phase_name(site.phase) + " on " + counter_text(site);
    const std::string why = r.abort->reason();
    if (!why.empty()) return Error("RANK_FAILED", why + " (" + where + ")", failed, phase_name(site.phase));
    return Error("RANK_FAILED", "rank " + std::to_string(failed) + " failed while " + where, failed, phase_name(site.phase));
  }
  return Error("RANK_FAILED", "rank " + std::to_string(r.rank) + " is shutting down", r.rank, phase_name(site.phase));
}

Error left_error(const Abort& a, int rank, const char* where) {
  const int left = a.left_rank();
  std::string why = a.left_reason();
  if (why.empty()) why = "rank " + std::to_string(left) + " left the group";
  return Error("RANK_FAILED", why + " (rank " + std::to_string(rank) + " was in " + where + "; the group goes on without it)", left, where);
}

Error release_error(const Abort& a, int rank, uint64_t seq, const char* where) {
  const int origin = a.release_origin();
  std::string why = a.release_reason();
  if (why.empty()) why = origin >= 0 ? "rank " + std::to_string(origin) + "'s program ended the run" : "the run was released";
  return Error("ABORTED", why + " (rank " + std::to_string(rank) + " was released from " + where + ", collective #" + std::to_string(seq) + ")",
               origin, where);
}

Error timeout_error(const WaitRules& r, const WaitSite& site, WaitKind kind, uint64_t last) {
  const bool cpu = kind == WaitKind::Cpu || r.device_is_cpu;
  const char* what = kind == WaitKind::Cpu ? "CPU-sync wait" : cpu ? "wait" : "device-phase wait";
  return Error(cpu ? "TIMEOUT_CPU" : "TIMEOUT_GPU",
               std::string(what) + " of rank " + std::to_string(r.rank) + " in " + phase_name(site.phase) + " timed out after " +
                   seconds_text(cpu ? r.cpu_timeout_s : r.gpu_timeout_s) + " s on counter " + counter_text(site) + " (last value " +
                   hex_text(last) + ")",
               site.peer, phase_name(site.phase));
}

}  // namespace rankflow
