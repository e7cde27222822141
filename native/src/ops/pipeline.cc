// Pipeline send/recv between ring neighbours and the engram table on the host executor.
#include <cstring>

#include "ops.hpp"

namespace rankflow::ops {

void pp_exchange(Context& c, const uint8_t* in, int64_t bytes, uint8_t* out) {
  RF_CHECK(bytes <= c.buffer_bytes(), "EINVAL",
           "ppExchange of " + std::to_string(bytes) + " bytes exceeds the buffer (" + std::to_string(c.buffer_bytes()) +
               " bytes; see ppSizeHint)");
  const uint32_t s = c.next_seq();
  const int next = (c.rank() + 1) % c.world(), prev = (c.rank() + c.world() - 1) % c.world();
  if (c.world() == 1) {
    std::memcpy(out, in, size_t(bytes));
    return;
  }
  if (c.on_cuda()) return c.device->pp_exchange(in, bytes, s, out);  // kernels: native/src/gpu/rank.cc
  // Only the previous rank writes into my buffer: tell it, and only wait for my next rank.
  store_release(c.peer_slot(prev, c.ws.enter), encode_signal(s, 0));
  c.wait_entered(next, s);
  std::memcpy(c.peer_buffer(next), in, size_t(bytes));
  store_release(c.peer_slot(next, c.ws.done), encode_signal(s, 0));
  c.wait_for(c.my_slot(c.ws.done, prev), s, WaitSite{kPhasePipeline, prev, "done"}, WaitKind::Device);
  std::memcpy(out, c.buffer(), size_t(bytes));
}

void engram_write(Context& c, const uint8_t* table, int64_t entries, int64_t row_bytes) {
  RF_CHECK(c.cpu_bytes > 0, "EINVAL",
           "engramWrite needs a host segment: create the group with buffer.cpuBytes >= " +
               std::to_string(entries * row_bytes) + " (engramSizeHint)");
  RF_CHECK(entries * row_bytes <= c.cpu_bytes, "EINVAL",
           "engram table of " + std::to_string(entries * row_bytes) + " bytes does not fit buffer.cpuBytes (" +
               std::to_string(c.cpu_bytes) + "); needs " + std::to_string(entries * row_bytes));
  const uint32_t s = c.next_seq();
  if (c.on_cuda()) {
    c.device->engram_write(table, entries * row_bytes, s);
  } else {
    // Peers may still be fetching from the previous table: overwrite only once all of them moved on.
    c.announce(s);
    for (int p = 0; p < c.world(); ++p) c.wait_entered(p, s);
    std::memcpy(c.mem.host_segment(c.rank()), table, size_t(entries * row_bytes));
    c.signal_all(c.ws.done, encode_signal(s, 0));
    c.wait_all(c.ws.done, s, kPhaseEngram, "done");
  }
  c.engram_entries = entries;
  c.engram_row_bytes = row_bytes;
}

void engram_fetch(Context& c, const int32_t* ids, int64_t n, uint8_t* out) {
  RF_CHECK(c.engram_entries >= 0, "STATE", "engramFetch before engramWrite: no table is stored");
  c.next_seq();
  const int64_t total = c.engram_entries * c.world();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t g = ids[i];
    RF_CHECK(g >= 0 && g < total, "EINVAL",
             "indices[" + std::to_string(i) + "] = " + std::to_string(g) + " is outside [0, " + std::to_string(total) + ")");
  }
  if (c.on_cuda()) return c.device->engram_fetch(ids, n, c.engram_entries, c.engram_row_bytes, out);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t g = ids[i];
    const int owner = int(g / c.engram_entries);
    const uint8_t* row = c.mem.host_segment(owner) + (g % c.engram_entries) * c.engram_row_bytes;
    std::memcpy(out + i * c.engram_row_bytes, row, size_t(c.engram_row_bytes));
  }
}

}  // namespace rankflow::ops
