// AGRS sessions on the host executor (seed 6.3). Opening and closing write the session index into
// every peer's session slot and wait for all of theirs. Inside a session every collective uses a
// fresh part of the buffer, so no per-collective "enter" round is needed: that is what sessions buy.
#include <cstring>

#include "ops.hpp"

namespace rankflow::ops {

namespace {

void write_and_wait(Context& c, uint32_t value, Phase phase) {
  c.signal_all(c.ws.session, encode_signal(value, 0));
  c.wait_all(c.ws.session, value, phase, "session");
}

// Reserves `bytes` of the session region for the next collective, or says why it cannot.
int64_t reserve(Context& c, int64_t bytes, const char* op) {
  Session& s = c.session;
  RF_CHECK(s.open, "STATE", std::string(op) + " outside an AGRS session: call openSession() first");
  RF_CHECK(s.collectives < s.max_all_gathers, "EINVAL",
           std::string(op) + ": the session allows " + std::to_string(s.max_all_gathers) + " collectives (maxAllGathers)");
  RF_CHECK(bytes <= s.max_bytes * c.world(), "EINVAL",
           std::string(op) + " of " + std::to_string(bytes / c.world()) + " bytes per rank exceeds the session's maxBytes (" +
               std::to_string(s.max_bytes) + ")");
  const int64_t at = s.cursor;
  s.cursor = align_up(s.cursor + bytes, kRegionAlignment);
  ++s.collectives;
  return at;
}

}  // namespace

void session_open(Context& c, int64_t max_bytes, int64_t max_all_gathers) {
  RF_CHECK(!c.session.open, "STATE", "an AGRS session is already open");
  const int64_t need = max_all_gathers * align_up(max_bytes * c.world(), kRegionAlignment);
  RF_CHECK(need <= c.buffer_bytes(), "EINVAL",
           "openSession: maxBytes * worldSize * maxAllGathers = " + std::to_string(need) + " bytes exceeds the buffer (" +
               std::to_string(c.buffer_bytes()) + " bytes)");
  c.next_seq();
  // The buffer may still hold data a slow peer reads for the previous op: wait until all entered.
  const uint32_t s = c.seq;
  if (c.on_cuda()) {  // kernels: native/src/gpu/rank.cc
    c.device->session_signal(s, 2 * (c.session.index + 1) - 1, kPhaseSessionOpen);
    c.session.index += 1;
  } else {
    c.announce(s);
    for (int p = 0; p < c.world(); ++p)
      if (p != c.rank()) c.wait_for(c.my_slot(c.ws.enter, p), s, WaitSite{kPhaseSessionOpen, p, "enter"}, WaitKind::Device);
    c.session.index += 1;
    write_and_wait(c, 2 * c.session.index - 1, kPhaseSessionOpen);
  }
  c.session.open = true;
  c.session.max_bytes = max_bytes;
  c.session.max_all_gathers = max_all_gathers;
  c.session.collectives = 0;
  c.session.cursor = 0;
}

void session_close(Context& c) {
  RF_CHECK(c.session.open, "STATE", "no AGRS session is open");
  c.next_seq();
  if (c.on_cuda()) c.device->session_signal(0, 2 * c.session.index, kPhaseSessionClose);
  else write_and_wait(c, 2 * c.session.index, kPhaseSessionClose);
  c.session.open = false;
}

void session_all_gather(Context& c, const uint8_t* in, int64_t bytes, uint8_t* out) {
  const int64_t at = reserve(c, bytes * c.world(), "session allGather");
  const uint32_t s = c.next_seq();
  if (c.on_cuda()) return c.device->session_all_gather(in, bytes, at, s, out);
  const int64_t mine = at + int64_t(c.rank()) * bytes;
  std::memcpy(c.buffer() + mine, in, size_t(bytes));
  for (int i = 1; i < c.world(); ++i) {
    const int p = (c.rank() + i) % c.world();
    std::memcpy(c.peer_buffer(p) + mine, in, size_t(bytes));
    store_release(c.peer_slot(p, c.ws.done), encode_signal(s, 0));
  }
  c.wait_all(c.ws.done, s, kPhaseSessionGather, "done");
  std::memcpy(out, c.buffer() + at, size_t(bytes * c.world()));
}

void session_reduce_scatter(Context& c, const void* in, int64_t n, bool bf16, void* out) {
  const int64_t esz = bf16 ? 2 : 4, chunk = n * esz;
  const int64_t at = reserve(c, chunk * c.world(), "session reduceScatter");
  const uint32_t s = c.next_seq();
  if (c.on_cuda()) return c.device->session_reduce_scatter(in, n, bf16, at, s, out);
  const auto* src = static_cast<const uint8_t*>(in);
  // Chunk q of my input goes to rank q, at my rank's slot of its region.
  for (int i = 0; i < c.world(); ++i) {
    const int q = (c.rank() + i) % c.world();
    uint8_t* dst = (q == c.rank() ? c.buffer() : c.peer_buffer(q)) + at + int64_t(c.rank()) * chunk;
    std::memcpy(dst, src + int64_t(q) * chunk, size_t(chunk));
    if (q != c.rank()) store_release(c.peer_slot(q, c.ws.done), encode_signal(s, 0));
  }
  c.wait_all(c.ws.done, s, kPhaseSessionReduce, "done");
  const uint8_t* region = c.buffer() + at;
  for (int64_t i = 0; i < n; ++i) {
    float acc = 0.0f;
    for (int q = 0; q < c.world(); ++q) {  // rank order: the CUDA kernel sums in the same order
      const uint8_t* part = region + int64_t(q) * chunk;
      acc += bf16 ? bf16_to_float(reinterpret_cast<const uint16_t*>(part)[i]) : reinterpret_cast<const float*>(part)[i];
    }
    if (bf16) static_cast<uint16_t*>(out)[i] = float_to_bf16(acc);
    else static_cast<float*>(out)[i] = acc;
  }
}

}  // namespace rankflow::ops
