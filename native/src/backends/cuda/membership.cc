// The CUDA backend's part of an elastic group's membership (runtime/ops/membership.cc): the live mask
// written into the rank's own workspace `live` slot in device memory, where every kernel reads it at
// its start (RankArgs::live: a graph captured before a membership change follows the new one when it
// replays), and a replacement rank's segments mapped over the old rank's addresses
// (SymmetricMemory::import_peer), so that the peer table and captured graphs stay valid. The ranks
// of one node only: the two-level layer's rails do not mask ranks.
#include "backend.hpp"
#include "driver.hpp"
#include "faults.hpp"

namespace rankflow::cuda {

// In stream order (the stream is non-blocking: a plain copy would not wait for it), then drained: every
// kernel launched after this reads the new mask. Stream memory ops where the GPU has them: no host
// staging, and no runtime wait (one would end at once on a left word raised again meanwhile, and the
// survivor would fail instead of re-forming).
void CudaBackend::write_live(uint64_t mask, uint64_t epoch) {
  const CUdeviceptr at = live_word();
  translating(rank(), [&] {
    if (stream_writes_) {
      RF_CU(cuStreamWriteValue64, stream_, at + CUdeviceptr(8 * kLiveEpochWord), epoch, CU_STREAM_WRITE_VALUE_DEFAULT);
      RF_CU(cuStreamWriteValue64, stream_, at + CUdeviceptr(8 * kLiveMaskWord), mask, CU_STREAM_WRITE_VALUE_DEFAULT);
      RF_CU(cuStreamSynchronize, stream_);
    } else {
      uint64_t words[2] = {0, 0};
      words[kLiveMaskWord] = mask;
      words[kLiveEpochWord] = epoch;
      RF_CU(cuStreamSynchronize, stream_);  // nothing of mine runs: a plain copy is ordered before my next kernel
      RF_CU(cuMemcpyHtoD, at, words, sizeof(words));
    }
  });
}

void CudaBackend::set_live(uint64_t mask, uint64_t epoch) {
  RF_CHECK(!c_.nodes.two_level(), "EINVAL",
           "elastic: a world of several nodes does not mask ranks on cuda (its rails need every rank)");
  check_alive("remask");
  write_live(mask, epoch);
}

void CudaBackend::import_peer(int peer, const ExportedSegments& seg) {
  RF_CHECK(!c_.nodes.two_level(), "EINVAL", "elastic: a world of several nodes cannot map a replacement rank on cuda");
  RF_CHECK(seg.device_fd >= 0, "EINVAL", "rank " + std::to_string(peer) + "'s replacement exported no device segment");
  RF_CHECK(mem_.host_bytes() == 0 || seg.host_fd >= 0, "EINVAL",
           "rank " + std::to_string(peer) + "'s replacement exported no host segment");
  check_alive("rejoin");
  translating(rank(), [&] {
    RF_CU(cuStreamSynchronize, stream_);  // nothing of mine may still read the old mapping
    mem_.import_peer(peer, seg);
  });
}

}  // namespace rankflow::cuda
