// The CUDA backend's waits (backend.hpp): whether the rank is still alive, the abort words passed on
// to waiting kernels, the one device wait (a stream, or the completion flag a kernel writes into
// mapped host memory) on runtime/wait.hpp's loop, and the Control block the kernels report into
// (timeouts, refused inputs); a failed stream.
#include <cstdio>

#include "backend.hpp"
#include "driver.hpp"
#include "faults.hpp"
#include "runtime/peer_reduce.hpp"
#include "runtime/wait.hpp"

namespace rankflow::cuda {

void CudaBackend::check_alive(const char* op) const {
  if (dead_)
    throw Error("RANK_FAILED",
                "rank " + std::to_string(rank()) + " cannot run " + op + ": its protocol state is gone (" + death_ +
                    "); destroy the group",
                rank());
}

void CudaBackend::mark_dead(const std::string& why) const {
  if (dead_) return;
  dead_ = true;
  death_ = why;
}

bool CudaBackend::abort_raised() const { return c_.abort.raised(); }

// After a run's release (runtime/ops/recover.cc): the stream drained (the released kernels gave up,
// the others ran to their end), then what a kernel that gave up leaves behind is cleared: the give-up
// flag every later wait of the rank would obey (arrivals[1]), the grid arrival count and work tickets, the fused
// dispatch's scratch, the Control block's reports and the mirrored release.
void CudaBackend::recover() {
  check_alive("recover");
  try {
    wait_stream(WaitSite{kPhaseNone, -1, "stream"});
  } catch (const Error& e) {
    // A fault or a timeout: the rank is dead (check_alive says so from now on). A release, or (elastic)
    // a peer that left again meanwhile: the stream drained, which is all this needed.
    if (e.code != "ABORTED" && !(e.code == "RANK_FAILED" && !dead_ && c_.abort.left_rank() >= 0)) throw;
  }
  translating(rank(), [&] {
    RF_CU(cuMemsetD8Async, arrivals_, 0, 64, stream_);
    if (fused_scratch_ != 0) RF_CU(cuMemsetD8Async, fused_scratch_, 0, size_t(fused_scratch_bytes_), stream_);
    RF_CU(cuStreamSynchronize, stream_);
  });
  volatile Control* k = ctl_;
  k->diag.code = 0;
  k->diag.want = 0;
  k->bad_seq = 0;
  using W = AbortWords;
  k->abort_mirror[W::kReleaseOrigin] = 0;
  k->abort_mirror[W::kLeftRank] = 0;  // elastic: the group re-formed (the main thread cleared the word)
  *reinterpret_cast<volatile uint64_t*>(k->abort_mirror + W::kReleasedAbove) = 0;
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

bool CudaBackend::released_now() const { return c_.abort.released(c_.seq); }

void CudaBackend::mirror_abort() {
  using W = AbortWords;
  const int32_t* w = c_.abort.words();
  volatile int32_t* m = ctl_->abort_mirror;
  m[W::kFailedRank] = __atomic_load_n(w + W::kFailedRank, __ATOMIC_ACQUIRE);
  m[W::kStopping] = c_.abort.stopping() ? 1 : 0;
  m[W::kReleaseOrigin] = __atomic_load_n(w + W::kReleaseOrigin, __ATOMIC_ACQUIRE);
  m[W::kLeftRank] = __atomic_load_n(w + W::kLeftRank, __ATOMIC_ACQUIRE);
  *reinterpret_cast<volatile uint64_t*>(m + W::kReleasedAbove) = c_.abort.released_above();
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

template <typename Ready>
void CudaBackend::wait_device(const WaitSite& site, Ready ready) {
  // Aborts are passed on to the kernels, then the wait goes on until the stream drained (its memory
  // may be freed after); the kernels give up within the GPU timeout, the CPU waits a little longer.
  // NCCL's kernels (two levels: the rail exchanges) never give up on their own: the rail
  // communicator is aborted instead, which stops them (the rank is failing anyway).
  // A run's release of the op is passed on the same way; the kernels of a released op give up, and
  // the op fails with ABORTED once the stream drained, the rank alive (ops/recover.cc puts it back in
  // step) except in two levels, whose NCCL kernels must be stopped by aborting their communicator.
  // A peer that left an elastic group (the left word) is passed on the same way: the kernels give up,
  // and once the stream drained the op fails with RANK_FAILED naming it, the rank alive (the group
  // re-forms without the peer: ops/membership.cc remask).
  bool aborted = false, released = false, left = false;
  WaitRules r = c_.rules;
  r.abort = nullptr;
  r.gpu_timeout_s = c_.cfg.gpu_timeout_s + 5;
  try {
    wait_until(r, site, WaitKind::Device, [&] {
      if (ready()) return true;
      if (!aborted && abort_raised()) {
        aborted = true;
        mirror_abort();
        abort_rails();
      }
      if (!left && !aborted && c_.abort.left_rank() >= 0) {
        left = true;
        mirror_abort();
      }
      if (!released && !aborted && released_now()) {
        released = true;
        mirror_abort();
        released_mid_op();
      }
      return false;
    }, [] { return uint64_t(0); });
  } catch (const Error& e) {
    mark_dead("its GPU work did not finish within the GPU timeout");
    abort_rails();  // two levels: an NCCL kernel waiting for a rail peer; the stream drains now
    throw Error("TIMEOUT_GPU", std::string(e.what()) + ": the rank's GPU work did not finish", site.peer,
                phase_name(site.phase));
  }
  // Raised while the op ran (its kernels may have given up before this wait saw it): the op's
  // results cannot be trusted, and the rank is failing anyway.
  if (aborted || abort_raised()) {
    const int failed = c_.abort.failed_rank();
    mark_dead(failed >= 0 ? "released after rank " + std::to_string(failed) + " failed" : "released at teardown");
    WaitRules a = c_.rules;
    throw abort_error(a, site);
  }
  if (left || c_.abort.left_rank() >= 0) throw left_error(c_.abort, rank(), phase_name(site.phase));
  if (released_now()) throw release_error(c_.abort, rank(), c_.seq, phase_name(site.phase));
  check_control(site);
}

// The stream writes a new value into mapped host memory once everything before it ran (a stream
// memory op, with its memory barrier), and the CPU spins on that word: no driver call per poll. A
// loop of cuStreamQuery took the context's lock on every poll, and ranks sharing a GPU (one context)
// waited for it in their launches. While capturing (nothing runs), or on a GPU without 64-bit stream
// memory ops, the stream is asked as before.
void CudaBackend::wait_stream(const WaitSite& site) {
  const Driver& d = driver();
  if (capturing_ || !stream_writes_) {
    wait_device(site, [&] {
      const CUresult res = d.cuStreamQuery(stream_);
      if (res == CUDA_SUCCESS) return true;
      if (res != CUDA_ERROR_NOT_READY) fail_stream(res);
      return false;
    });
    return;
  }
  const uint64_t seq = ++synced_;
  translating(rank(), [&] {
    RF_CU(cuStreamWriteValue64, stream_, ctl_dev_ + CUdeviceptr(offsetof(Control, synced_seq)), seq, CU_STREAM_WRITE_VALUE_DEFAULT);
  });
  wait_flag(&ctl_->synced_seq, seq, site);
}

// An async op's end (async.cc): its event, queried in the same loop.
void CudaBackend::wait_event(CUevent e, const WaitSite& site) {
  const Driver& d = driver();
  wait_device(site, [&] {
    const CUresult res = d.cuEventQuery(e);
    if (res == CUDA_SUCCESS) return true;
    if (res != CUDA_ERROR_NOT_READY) fail_stream(res);
    return false;
  });
}

// The barrier kernel writes the op's sequence number into Control.completed_seq at its end: a spin on
// mapped host memory, no driver call, except every few hundred polls to see a fault early.
void CudaBackend::wait_completed(uint64_t seq, const WaitSite& site) { wait_flag(&ctl_->completed_seq, seq, site); }

// A spin on mapped host memory, except every few hundred polls a stream query to see a fault early.
void CudaBackend::wait_flag(const volatile uint64_t* word, uint64_t seq, const WaitSite& site) {
  const Driver& d = driver();
  uint32_t polls = 0;
  wait_device(site, [&] {
    if (*word >= seq) return true;
    if ((++polls & 255) == 0) {
      const CUresult res = d.cuStreamQuery(stream_);
      if (res != CUDA_SUCCESS && res != CUDA_ERROR_NOT_READY) fail_stream(res);
    }
    return false;
  });
}

void CudaBackend::check_control(const WaitSite& site) {
  check_gave_up();
  check_refused();
  (void)site;
}

void CudaBackend::check_gave_up() {
  volatile Control* k = ctl_;
  if (k->diag.code == kDiagTimeout) {
    const uint64_t phase = k->diag.phase;
    const int peer = int(k->diag.peer);
    mark_dead("a device-side wait timed out");
    throw Error("TIMEOUT_GPU",
                "device-phase wait of rank " + std::to_string(rank()) + " in " + phase_name(phase) + " timed out after " +
                    seconds_text(c_.cfg.gpu_timeout_s) + " s on counter " +
                    (phase == kPhaseBarrier ? "barrier" : phase == kPhaseEnter ? "enter" : "done") + "[from rank " +
                    std::to_string(peer) + "] (" + (k->diag.want != 0 ? "waiting for " + hex_text(k->diag.want) + ", " : "") +
                    "last value " + hex_text(k->diag.value) +
                    "); the kernels gave up, so rank " + std::to_string(rank()) +
                    "'s protocol state is gone, but its GPU stays usable: destroy the group (a new one works)",
                peer, phase_name(phase));
  }
}

void CudaBackend::check_refused() {
  volatile Control* k = ctl_;
  if (k->bad_seq != 0) {
    const uint64_t seq = k->bad_seq;
    const int64_t index = k->bad_index, value = k->bad_value;
    k->bad_seq = 0;
    if (index == kBadShape)
      throw peer_shape_error(int(value), rank(), "in op #" + std::to_string(seq) +
                                                     ": every rank must pass the same shape and dtype (found on the GPU: nothing moved)");
    if (index == kBadHandle)
      throw Error("EINVAL", "inputs.handle: rank " + std::to_string(value) + " replays another dispatch's handle than rank " +
                                std::to_string(rank()) + " in dispatch/combine #" + std::to_string(seq) +
                                ": every rank must pass the handle of the same dispatch (that op moved no rows between them)");
    throw Error("EINVAL", "topkIdx[" + std::to_string(index) + "]: " + std::to_string(value) + " is outside [0, " +
                              std::to_string(c_.cfg.ep.num_experts) + ") and not -1 (dispatch #" + std::to_string(seq) +
                              ", found on the GPU: that slot was dropped)");
  }
}

// A launch failed: a kernel faulted (device waits never trap). CUDA's launch failures are sticky for
// the whole process: every rank's context in it is dead.
void CudaBackend::fail_stream(CUresult r) {
  const std::string name = error_name(r);
  mark_dead("a kernel failed with " + name);
  std::string note;
  const int culprit = faulted_elsewhere(rank(), &note);
  if (culprit >= 0)
    throw Error("RANK_FAILED", "rank " + std::to_string(rank()) + ": its stream failed with " + name + "." + note, culprit);
  record_fault(rank(), "rank " + std::to_string(rank()) + "'s kernel on GPU " + std::to_string(ordinal_) + " failed with " + name);
  throw Error("RANK_FAILED",
              "rank " + std::to_string(rank()) + ": a kernel failed with " + name +
                  " (a fault, not a timeout); the GPU context is dead: destroy the group",
              rank());
}

// Driver mode's device copy of host tensors: grown in stream order (the old block is freed after the
// work queued on it), never with a device-wide synchronisation.

}  // namespace rankflow::cuda
