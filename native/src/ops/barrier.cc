// barrier and allGather on the host executor.
#include <cstring>

#include "ops.hpp"

namespace rankflow::ops {

void barrier(Context& c, bool cpu_round) {
  if (c.on_cuda()) return c.device->barrier(cpu_round);  // kernels: native/src/gpu/rank.cc
  if (cpu_round) {
    // DeepEP's with_cpu_sync: after the device barrier (same seq), a rendezvous the CPUs wait on.
    const uint32_t s = c.seq;
    c.signal_all(c.ws.cpu_barrier, encode_signal(s, 0));
    c.wait_all(c.ws.cpu_barrier, s, kPhaseCpuBarrier, "cpu_barrier", WaitKind::Cpu);
    return;
  }
  const uint32_t s = c.next_seq();
  c.signal_all(c.ws.barrier, encode_signal(s, 0));
  c.wait_all(c.ws.barrier, s, kPhaseBarrier, "barrier");
}

void all_gather(Context& c, const uint8_t* in, int64_t bytes, uint8_t* out) {
  if (c.on_cuda()) return c.device->all_gather(in, bytes, out);
  RF_CHECK(bytes * c.world() <= c.buffer_bytes(), "EINVAL",
           "allGather of " + std::to_string(bytes) + " bytes per rank needs " + std::to_string(bytes * c.world()) +
               " buffer bytes; the buffer has " + std::to_string(c.buffer_bytes()) + " (raise buffer.bytes)");
  const uint32_t s = c.next_seq();
  c.announce(s);
  const int64_t at = int64_t(c.rank()) * bytes;
  std::memcpy(c.buffer() + at, in, size_t(bytes));
  for (int i = 1; i < c.world(); ++i) {  // start at the next rank so that no receiver is hit by everyone first
    const int p = (c.rank() + i) % c.world();
    c.wait_entered(p, s);
    std::memcpy(c.peer_buffer(p) + at, in, size_t(bytes));
    store_release(c.peer_slot(p, c.ws.done), encode_signal(s, 0));
  }
  c.wait_all(c.ws.done, s, kPhaseAllGather, "done");
  std::memcpy(out, c.buffer(), size_t(bytes * c.world()));
}

}  // namespace rankflow::ops
