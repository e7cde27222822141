// The host backend's scale-out leg: one TCP connection from a rank to each of its rail peers (the
// ranks of its local index on the other nodes, runtime/scaleout.hpp), and the exchange that every
// two-level op runs over them.
//
// Connecting: every rank listens (listen), the TypeScript layer passes the endpoints around through
// the rendezvous, then each rank dials its rail peers on lower nodes and accepts those of higher
// nodes (connect), all at once in one poll loop. Every connection passes an HMAC-SHA256
// challenge-response over the world's rail key before it counts, both ways:
//   listener  -> connector  "RFRC" listener rank, nonce L                    (a fresh nonce per connection)
//   connector -> listener   "RFRA" from, to, nonce C, HMAC(key, "rankflow-rail/1 connector" L C from to)
//   listener  -> connector  "RFRP" HMAC(key, "rankflow-rail/1 listener" L C from to)
// Handshake messages have fixed sizes; a connection that sends anything else, proves nothing within
// 5 s, or names a rank that is not an expected rail peer is dropped; at most 16 wait at once (one more
// evicts the oldest), so strangers cannot keep a world from forming, only fail to join it.
//
// Exchanging: at most one frame each way per rail peer and op, sent and received at once (non-blocking
// sockets, poll), so that no order of peers can deadlock. A frame is a 40-byte header (magic, phase,
// seq, tag, aux, payload bytes; little endian) and its payload; every header is checked against the op
// the receiver is in and every length against what that op can take before a byte of payload is read,
// and no more than one frame is ever read (the next op's frame stays in the socket). A closed
// connection, a frame of another op, a timeout or an abort breaks the connections for good: the
// rank's later ops fail at once with RANK_FAILED (check_alive).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/context.hpp"
#include "runtime/wait.hpp"

namespace rankflow::host {

// One frame a rank sends to its rail peer on `node`.
struct RailSend {
  int node;
  const uint8_t* data;
  int64_t bytes;
  uint64_t aux = 0;  // a word for the receiver's checks (dispatch: the bytes of one token record)
};

// One frame a rank expects from its rail peer on `node`: at most max_bytes of payload.
struct RailRecv {
  int node;
  int64_t max_bytes;
  std::vector<uint8_t> data;  // the payload, on return
  uint64_t tag = 0;           // the sender's tag (the fingerprint of its dispatch layout)
  uint64_t aux = 0;
};

class Rails {
 public:
  explicit Rails(Context& c);
  ~Rails() { close(); }
  Rails(const Rails&) = delete;
  Rails& operator=(const Rails&) = delete;

  // Listens on host:0 (host "" or "0.0.0.0": every interface); the port.
  int listen(const std::string& host);
  // Makes and authenticates the connection to every rail peer (see the file header). ends: one per
  // global rank. Waits at most timeout_s (TIMEOUT_CPU naming the missing peers), ends on an abort.
  void connect(const std::vector<ScaleoutEndpoint>& ends, const RailKey& key, double timeout_s);
  // Sends `sends` and receives `recvs` of op (seq, phase) at once; `tag` goes into every header sent.
  // Waits as the op's waits do (kind: TIMEOUT_GPU for device phases, TIMEOUT_CPU for CPU syncs).
  void exchange(uint64_t seq, Phase phase, uint64_t tag, const std::vector<RailSend>& sends, std::vector<RailRecv>& recvs,
                WaitKind kind);
  bool connected() const { return connected_; }
  // RANK_FAILED (naming the peer that broke them) once the connections are broken.
  void check_alive(const char* op) const;
  void close() noexcept;

 private:
  [[noreturn]] void fail(const std::string& code, const std::string& message, int peer, Phase phase);
  int peer_rank(int node) const { return c_.nodes.rail_peer(node); }

  Context& c_;
  std::vector<int> fd_;  // [node]: the connection to the rail peer there; -1 for this rank's node
  int listen_fd_ = -1;
  bool connected_ = false;
  std::string broken_;   // why the connections cannot be used any more; empty while they can
  int broken_rank_ = -1;
};

}  // namespace rankflow::host
