// The scale-out leg of the host backend: listening, connecting with the handshake, and the exchange
// of frames (see rail.hpp).
#include "rail.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "hmac.hpp"

namespace rankflow::host {

namespace {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kFrameMagic = 0x31534652;      // "RFS1"
constexpr uint32_t kChallengeMagic = 0x43524652;  // "RFRC"
constexpr uint32_t kAuthMagic = 0x41524652;       // "RFRA"
constexpr uint32_t kProofMagic = 0x50524652;      // "RFRP"
constexpr size_t kHeaderBytes = 40;               // magic, phase, seq, tag, aux, bytes
constexpr size_t kChallengeBytes = 40;            // magic, listener rank, nonce
constexpr size_t kAuthBytes = 76;                 // magic, from, to, nonce, mac
constexpr size_t kProofBytes = 36;                // magic, mac
constexpr size_t kNonceBytes = 32;
constexpr int kMaxPending = 16;                   // accepted connections not authenticated yet
constexpr auto kHandshakeTime = std::chrono::seconds(5);
constexpr auto kPollSlice = std::chrono::milliseconds(10);  // how often a blocked exchange checks its abort words

void put32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = uint8_t(v >> (8 * i));
}
void put64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = uint8_t(v >> (8 * i));
}
uint32_t get32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t(p[i]) << (8 * i);
  return v;
}
uint64_t get64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t(p[i]) << (8 * i);
  return v;
}

std::string errno_text(int e) { return std::strerror(e); }

// A numeric host and a port as a socket address (no name lookup: the TypeScript layer passes addresses).
addrinfo* resolve(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV | AI_PASSIVE;
  addrinfo* ai = nullptr;
  const std::string service = std::to_string(port);
  const int r = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &ai);
  RF_CHECK(r == 0 && ai != nullptr, "EINVAL",
           "scale-out: '" + host + "' is not a numeric IP address (" + std::string(gai_strerror(r)) + ")");
  return ai;
}

void random_bytes(uint8_t* p, size_t n) {
  while (n > 0) {
    const ssize_t r = getrandom(p, n, 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      throw sys_error("getrandom");
    }
    p += r, n -= size_t(r);
  }
}

// The MAC of one side of a handshake (see rail.hpp).
Digest handshake_mac(const RailKey& key, const char* role, const uint8_t* nonce_l, const uint8_t* nonce_c, int from, int to) {
  uint8_t ranks[8];
  put32(ranks, uint32_t(from));
  put32(ranks + 4, uint32_t(to));
  const std::string label = std::string("rankflow-rail/1 ") + role + "\n";
  const Part parts[] = {{label.data(), label.size()}, {nonce_l, kNonceBytes}, {nonce_c, kNonceBytes}, {ranks, sizeof ranks}};
  return hmac_sha256(key.data(), key.size(), parts, 4);
}

void tune(int fd) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
}

}  // namespace

Rails::Rails(Context& c) : c_(c) { fd_.assign(size_t(c.nodes.num_nodes), -1); }

void Rails::close() noexcept {
  for (int& fd : fd_)
    if (fd >= 0) ::close(fd), fd = -1;
  if (listen_fd_ >= 0) ::close(listen_fd_), listen_fd_ = -1;
  connected_ = false;
}

void Rails::check_alive(const char* op) const {
  if (broken_.empty()) return;
  throw Error("RANK_FAILED", std::string(op) + ": the scale-out connections of rank " + std::to_string(c_.rank()) +
                                 " are broken (" + broken_ + "); make the group again",
              broken_rank_);
}

void Rails::fail(const std::string& code, const std::string& message, int peer, Phase phase) {
  if (broken_.empty()) broken_ = message, broken_rank_ = peer;
  throw Error(code, message, peer, phase_name(phase));
}

int Rails::listen(const std::string& host) {
  RF_CHECK(listen_fd_ < 0 && !connected_, "STATE", "scale-out: this rank is already listening or connected");
  hmac_self_test();
  addrinfo* ai = resolve(host == "0.0.0.0" ? std::string() : host, 0);
  const int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    freeaddrinfo(ai);
    throw sys_error("scale-out: socket");
  }
  if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(fd, 64) != 0) {
    const int e = errno;
    freeaddrinfo(ai);
    ::close(fd);
    throw Error("EINVAL", "scale-out: cannot listen on " + host + ": " + errno_text(e));
  }
  freeaddrinfo(ai);
  sockaddr_storage at{};
  socklen_t len = sizeof at;
  getsockname(fd, reinterpret_cast<sockaddr*>(&at), &len);
  listen_fd_ = fd;
  return ntohs(at.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&at)->sin6_port : reinterpret_cast<sockaddr_in*>(&at)->sin_port);
}

namespace {

// One connection during connect(): dialled (active) or accepted (passive), until it has authenticated.
struct Handshake {
  enum State { kDialling, kAwaitChallenge, kAwaitProof, kAwaitAuth, kSendingProof };
  int fd = -1;
  bool active = false;
  int node = -1;  // active: the node dialled; passive: the node it proved to be from
  State state = kDialling;
  uint8_t in[kAuthBytes];
  size_t have = 0, need = 0;
  uint8_t out[kAuthBytes];
  size_t out_len = 0, out_sent = 0;
  uint8_t nonce_l[kNonceBytes], nonce_c[kNonceBytes];
  Clock::time_point deadline;
};

}  // namespace

void Rails::connect(const std::vector<ScaleoutEndpoint>& ends, const RailKey& key, double timeout_s) {
  const Nodes& nd = c_.nodes;
  const int me = c_.rank();
  RF_CHECK(int(ends.size()) == c_.world(), "EINVAL", "scale-out: connect needs one endpoint per rank");
  RF_CHECK(listen_fd_ >= 0 && !connected_, "STATE", "scale-out: listen() first, and connect once");
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  std::vector<Handshake> hs;
  std::vector<Clock::time_point> retry_at(size_t(nd.num_nodes), start);
  std::vector<std::string> why(size_t(nd.num_nodes));  // the last failure with each peer
  std::vector<int64_t> backoff_ms(size_t(nd.num_nodes), 20);
  int strangers = 0;
  std::string stranger_why;

  auto drop = [&](size_t i, const std::string& reason) {
    Handshake& h = hs[i];
    ::close(h.fd);
    if (h.active) {
      why[size_t(h.node)] = reason;
      retry_at[size_t(h.node)] = Clock::now() + std::chrono::milliseconds(backoff_ms[size_t(h.node)]);
      backoff_ms[size_t(h.node)] = std::min<int64_t>(backoff_ms[size_t(h.node)] * 2, 500);
    } else {
      ++strangers;
      stranger_why = reason;
    }
    hs.erase(hs.begin() + std::ptrdiff_t(i));
  };
  auto connected_to = [&](size_t i) {
    Handshake& h = hs[i];
    tune(h.fd);
    fd_[size_t(h.node)] = h.fd;
    hs.erase(hs.begin() + std::ptrdiff_t(i));
  };
  auto all_connected = [&] {
    for (int k = 0; k < nd.num_nodes; ++k)
      if (k != nd.node && fd_[size_t(k)] < 0) return false;
    return true;
  };
  auto cleanup = [&] {
    for (const Handshake& h : hs) ::close(h.fd);
    hs.clear();
  };

  try {
    while (!all_connected()) {
      const auto now = Clock::now();
      // Dial the rail peers of lower nodes that are not connected or being dialled.
      for (int k = 0; k < nd.node; ++k) {
        if (fd_[size_t(k)] >= 0 || now < retry_at[size_t(k)]) continue;
        if (std::any_of(hs.begin(), hs.end(), [&](const Handshake& h) { return h.active && h.node == k; })) continue;
        const ScaleoutEndpoint& e = ends[size_t(peer_rank(k))];
        RF_CHECK(!e.host.empty() && e.port > 0 && e.port < 65536, "EINVAL",
                 "scale-out: rank " + std::to_string(peer_rank(k)) + " has no endpoint to connect to");
        addrinfo* ai = resolve(e.host, e.port);
        Handshake h;
        h.active = true;
        h.node = k;
        h.fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        const int r = h.fd < 0 ? -1 : ::connect(h.fd, ai->ai_addr, ai->ai_addrlen);
        const int err = errno;
        freeaddrinfo(ai);
        if (h.fd < 0) throw sys_error("scale-out: socket");
        h.deadline = now + kHandshakeTime;
        if (r == 0 || err == EINPROGRESS) {
          h.state = r == 0 ? Handshake::kAwaitChallenge : Handshake::kDialling;
          h.need = kChallengeBytes;
          hs.push_back(h);
        } else {
          ::close(h.fd);
          why[size_t(k)] = "connect to " + e.host + ":" + std::to_string(e.port) + ": " + errno_text(err);
          retry_at[size_t(k)] = now + std::chrono::milliseconds(backoff_ms[size_t(k)]);
          backoff_ms[size_t(k)] = std::min<int64_t>(backoff_ms[size_t(k)] * 2, 500);
        }
      }
      std::vector<pollfd> pfd;
      pfd.push_back({listen_fd_, POLLIN, 0});
      for (const Handshake& h : hs) {
        short ev = 0;
        if (h.state == Handshake::kDialling || h.out_sent < h.out_len) ev |= POLLOUT;
        if (h.state != Handshake::kDialling && h.out_sent >= h.out_len) ev |= POLLIN;
        pfd.push_back({h.fd, ev, 0});
      }
      ::poll(pfd.data(), nfds_t(pfd.size()), 20);
      const auto t = Clock::now();
      // Handshakes first (indices match pfd[1..]), from the back so that erasing keeps them aligned.
      for (size_t i = hs.size(); i-- > 0;) {
        Handshake& h = hs[i];
        const short rev = pfd[i + 1].revents;
        if (h.state == Handshake::kDialling) {
          if ((rev & (POLLOUT | POLLERR | POLLHUP)) == 0) {
            if (t > h.deadline) drop(i, "connect timed out");
            continue;
          }
          int err = 0;
          socklen_t len = sizeof err;
          getsockopt(h.fd, SOL_SOCKET, SO_ERROR, &err, &len);
          if (err != 0) {
            drop(i, "connect: " + errno_text(err));
            continue;
          }
          h.state = Handshake::kAwaitChallenge;
          h.need = kChallengeBytes;
          continue;
        }
        if (h.out_sent < h.out_len) {
          const ssize_t n = send(h.fd, h.out + h.out_sent, h.out_len - h.out_sent, MSG_NOSIGNAL | MSG_DONTWAIT);
          if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            drop(i, "send: " + errno_text(errno));
            continue;
          }
          if (n > 0) h.out_sent += size_t(n);
          if (h.out_sent < h.out_len) continue;
          if (h.state == Handshake::kSendingProof) {
            connected_to(i);
            continue;
          }
        }
        if ((rev & (POLLIN | POLLHUP | POLLERR)) != 0 && h.have < h.need) {
          const ssize_t n = recv(h.fd, h.in + h.have, h.need - h.have, MSG_DONTWAIT);
          if (n == 0) {
            drop(i, h.active ? "the peer closed the connection during the handshake (it refused this rank's proof: "
                               "another world, or a different world.token?)"
                             : "closed during the handshake");
            continue;
          }
          if (n < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) drop(i, "recv: " + errno_text(errno));
            continue;
          }
          h.have += size_t(n);
        }
        if (h.have < h.need) {
          if (t > h.deadline) drop(i, "no handshake within 5 s");
          continue;
        }
        // A whole handshake message.
        h.have = 0;
        if (h.state == Handshake::kAwaitChallenge) {
          const int listener = int(get32(h.in + 4));
          if (get32(h.in) != kChallengeMagic || listener != peer_rank(h.node)) {
            drop(i, "what answers at the endpoint of rank " + std::to_string(peer_rank(h.node)) + " is not that rank's scale-out listener");
            continue;
          }
          std::memcpy(h.nonce_l, h.in + 8, kNonceBytes);
          random_bytes(h.nonce_c, kNonceBytes);
          const Digest mac = handshake_mac(key, "connector", h.nonce_l, h.nonce_c, me, listener);
          put32(h.out, kAuthMagic);
          put32(h.out + 4, uint32_t(me));
          put32(h.out + 8, uint32_t(listener));
          std::memcpy(h.out + 12, h.nonce_c, kNonceBytes);
          std::memcpy(h.out + 44, mac.data(), mac.size());
          h.out_len = kAuthBytes, h.out_sent = 0;
          h.state = Handshake::kAwaitProof;
          h.need = kProofBytes;
        } else if (h.state == Handshake::kAwaitProof) {
          const Digest want = handshake_mac(key, "listener", h.nonce_l, h.nonce_c, me, peer_rank(h.node));
          if (get32(h.in) != kProofMagic || !mac_equal(h.in + 4, want.data())) {
            drop(i, "rank " + std::to_string(peer_rank(h.node)) + "'s listener could not prove that it knows the world's key");
            continue;
          }
          connected_to(i);
        } else if (h.state == Handshake::kAwaitAuth) {
          const int from = int(get32(h.in + 4)), to = int(get32(h.in + 8));
          const bool expected = from >= 0 && from < c_.world() && nd.node_of(from) > nd.node && nd.local_of(from) == nd.local &&
                                fd_[size_t(nd.node_of(from))] < 0;
          if (get32(h.in) != kAuthMagic || to != me || !expected) {
            drop(i, "it did not name itself as an expected rail peer of rank " + std::to_string(me));
            continue;
          }
          std::memcpy(h.nonce_c, h.in + 12, kNonceBytes);
          const Digest want = handshake_mac(key, "connector", h.nonce_l, h.nonce_c, from, me);
          if (!mac_equal(h.in + 44, want.data())) {
            drop(i, "it failed authentication (another world, or a different world.token)");
            continue;
          }
          const Digest proof = handshake_mac(key, "listener", h.nonce_l, h.nonce_c, from, me);
          put32(h.out, kProofMagic);
          std::memcpy(h.out + 4, proof.data(), proof.size());
          h.out_len = kProofBytes, h.out_sent = 0;
          h.node = nd.node_of(from);
          h.state = Handshake::kSendingProof;
          h.need = 0;
        }
      }
      // New connections: each is challenged at once; beyond kMaxPending the oldest is let go.
      if ((pfd[0].revents & POLLIN) != 0) {
        for (;;) {
          const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
          if (fd < 0) break;
          const auto pending = std::count_if(hs.begin(), hs.end(), [](const Handshake& h) { return !h.active; });
          if (pending >= kMaxPending) {
            const auto oldest = std::find_if(hs.begin(), hs.end(), [](const Handshake& h) { return !h.active; });
            drop(size_t(oldest - hs.begin()), "evicted: too many connections were waiting to authenticate");
          }
          Handshake h;
          h.fd = fd;
          h.state = Handshake::kAwaitAuth;
          h.need = kAuthBytes;
          h.deadline = t + kHandshakeTime;
          random_bytes(h.nonce_l, kNonceBytes);
          put32(h.out, kChallengeMagic);
          put32(h.out + 4, uint32_t(me));
          std::memcpy(h.out + 8, h.nonce_l, kNonceBytes);
          h.out_len = kChallengeBytes;
          hs.push_back(h);
        }
      }
      if (c_.abort.raised()) throw abort_error(c_.rules, WaitSite{kPhaseScaleoutConnect, -1, "scale-out connections"});
      if (t > deadline) {
        std::string missing;
        int first = -1;
        for (int k = 0; k < nd.num_nodes; ++k) {
          if (k == nd.node || fd_[size_t(k)] >= 0) continue;
          if (first < 0) first = peer_rank(k);
          missing += (missing.empty() ? "" : "; ") + std::string("rank ") + std::to_string(peer_rank(k)) + " (node " + std::to_string(k) + ")";
          if (!why[size_t(k)].empty()) missing += ": " + why[size_t(k)];
        }
        std::string extra;
        if (strangers > 0)
          extra = "; " + std::to_string(strangers) + " connection" + (strangers == 1 ? "" : "s") + " dropped (last: " + stranger_why + ")";
        throw Error("TIMEOUT_CPU", "scale-out connect of rank " + std::to_string(me) + " timed out after " + seconds_text(timeout_s) +
                                       " s with no authenticated connection to " + missing + extra,
                    first, phase_name(kPhaseScaleoutConnect));
      }
    }
  } catch (...) {
    cleanup();
    throw;
  }
  ::close(listen_fd_);
  listen_fd_ = -1;
  connected_ = true;
}

void Rails::exchange(uint64_t seq, Phase phase, uint64_t tag, const std::vector<RailSend>& sends, std::vector<RailRecv>& recvs,
                     WaitKind kind) {
  check_alive(phase_name(phase));
  RF_CHECK(connected_, "STATE", "scale-out: the rank's rail connections are not made");
  const Nodes& nd = c_.nodes;
  const auto start = Clock::now();
  struct Out {
    int fd, node;
    uint8_t head[kHeaderBytes];
    const uint8_t* data;
    int64_t bytes, sent;  // sent: header and payload bytes written
  };
  struct In {
    int fd;
    RailRecv* r;
    uint8_t head[kHeaderBytes];
    int64_t got;  // header and payload bytes read
    int64_t bytes;
  };
  std::vector<Out> outs;
  std::vector<In> ins;
  int64_t payload = 0;
  for (const RailSend& s : sends) {
    RF_CHECK(s.node >= 0 && s.node < nd.num_nodes && s.node != nd.node, "EINVAL", "scale-out: a frame for an invalid node");
    Out o{fd_[size_t(s.node)], s.node, {}, s.data, s.bytes, 0};
    put32(o.head, kFrameMagic);
    put32(o.head + 4, uint32_t(phase));
    put64(o.head + 8, seq);
    put64(o.head + 16, tag);
    put64(o.head + 24, s.aux);
    put64(o.head + 32, uint64_t(s.bytes));
    outs.push_back(o);
    payload += s.bytes;
  }
  for (RailRecv& r : recvs) {
    RF_CHECK(r.node >= 0 && r.node < nd.num_nodes && r.node != nd.node, "EINVAL", "scale-out: a frame from an invalid node");
    ins.push_back(In{fd_[size_t(r.node)], &r, {}, 0, -1});
  }
  const std::string op = std::string(phase_name(phase)) + " #" + std::to_string(seq);
  auto lost = [&](int node, int err) {
    const int peer = peer_rank(node);
    fail("RANK_FAILED",
         "rank " + std::to_string(peer) + " (node " + std::to_string(node) + ") is gone: its scale-out connection to rank " +
             std::to_string(c_.rank()) + (err == 0 ? " closed" : " failed (" + errno_text(err) + ")") + " during " + op,
         peer, phase);
  };
  // Writes what it can; false when the socket takes no more now.
  auto pump_out = [&](Out& o) {
    while (o.sent < int64_t(kHeaderBytes) + o.bytes) {
      iovec iov[2];
      int n = 0;
      if (o.sent < int64_t(kHeaderBytes)) iov[n++] = {o.head + o.sent, size_t(int64_t(kHeaderBytes) - o.sent)};
      const int64_t done = std::max<int64_t>(0, o.sent - int64_t(kHeaderBytes));
      if (o.bytes > done) iov[n++] = {const_cast<uint8_t*>(o.data) + done, size_t(o.bytes - done)};
      msghdr m{};
      m.msg_iov = iov;
      m.msg_iovlen = size_t(n);
      const ssize_t w = sendmsg(o.fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
        lost(o.node, errno);
      }
      o.sent += w;
    }
    return true;
  };
  // Reads what has come of this frame and no more; false while it is incomplete.
  auto pump_in = [&](In& in) {
    for (;;) {
      const bool head = in.got < int64_t(kHeaderBytes);
      const int64_t want = head ? int64_t(kHeaderBytes) - in.got : in.bytes - (in.got - int64_t(kHeaderBytes));
      if (want == 0) return true;
      uint8_t* at = head ? in.head + in.got : in.r->data.data() + (in.got - int64_t(kHeaderBytes));
      const ssize_t n = recv(in.fd, at, size_t(want), MSG_DONTWAIT);
      if (n == 0) lost(in.r->node, 0);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
        lost(in.r->node, errno);
      }
      in.got += n;
      if (head && in.got == int64_t(kHeaderBytes)) {
        const int peer = peer_rank(in.r->node);
        const uint32_t magic = get32(in.head), their_phase = get32(in.head + 4);
        const uint64_t their_seq = get64(in.head + 8), bytes = get64(in.head + 32);
        if (magic != kFrameMagic)
          fail("RANK_FAILED", "rank " + std::to_string(peer) + " sent bytes that are not a rankflow scale-out frame during " + op, peer, phase);
        if (their_seq != seq || their_phase != uint32_t(phase))
          fail("RANK_FAILED",
               "rank " + std::to_string(peer) + " sent a frame of " + phase_name(their_phase) + " #" + std::to_string(their_seq) +
                   " while rank " + std::to_string(c_.rank()) + " is in " + op +
                   ": every rank must run the same collectives in the same order",
               peer, phase);
        if (bytes > uint64_t(in.r->max_bytes))
          fail("RANK_FAILED",
               "rank " + std::to_string(peer) + " announced a frame of " + std::to_string(bytes) + " bytes in " + op + "; at most " +
                   std::to_string(in.r->max_bytes) + " fit",
               peer, phase);
        in.bytes = int64_t(bytes);
        in.r->tag = get64(in.head + 16);
        in.r->aux = get64(in.head + 24);
        in.r->data.resize(size_t(bytes));
      }
    }
  };
  const double timeout = kind == WaitKind::Cpu ? c_.rules.cpu_timeout_s : c_.rules.gpu_timeout_s;
  auto slow_at = start + std::chrono::nanoseconds(c_.rules.slow_ns);
  std::vector<pollfd> pfd;
  for (;;) {
    bool all = true;
    for (Out& o : outs) all = pump_out(o) && all;
    for (In& in : ins) all = pump_in(in) && all;
    if (all) break;
    pfd.clear();
    auto watch = [&](int fd, short ev) {
      for (pollfd& p : pfd)
        if (p.fd == fd) return void(p.events |= ev);
      pfd.push_back({fd, ev, 0});
    };
    for (const Out& o : outs)
      if (o.sent < int64_t(kHeaderBytes) + o.bytes) watch(o.fd, POLLOUT);
    for (const In& in : ins)
      if (in.got < int64_t(kHeaderBytes) || in.got - int64_t(kHeaderBytes) < in.bytes) watch(in.fd, POLLIN);
    ::poll(pfd.data(), nfds_t(pfd.size()), int(std::chrono::duration_cast<std::chrono::milliseconds>(kPollSlice).count()));
    const auto now = Clock::now();
    if (c_.abort.raised()) {
      const Error e = abort_error(c_.rules, WaitSite{phase, -1, "scale-out frame"});
      fail(e.code, e.what(), e.rank, phase);
    }
    if (c_.rules.slow != nullptr && now >= slow_at) {
      slow_at = Clock::time_point::max();
      c_.rules.slow(c_.rules.slow_arg);
    }
    if (std::chrono::duration<double>(now - start).count() > timeout) {
      int peer = -1;
      uint64_t got = 0;
      for (const In& in : ins)
        if (in.got < int64_t(kHeaderBytes) + std::max<int64_t>(in.bytes, 0)) peer = peer_rank(in.r->node), got = uint64_t(in.got);
      for (const Out& o : outs)
        if (peer < 0 && o.sent < int64_t(kHeaderBytes) + o.bytes) peer = peer_rank(o.node), got = uint64_t(o.sent);
      const Error e = timeout_error(c_.rules, WaitSite{phase, peer, "scale-out frame"}, kind, got);
      fail(e.code, e.what(), e.rank, phase);
    }
  }
  c_.traffic.out(payload);
  c_.traffic.add(Traffic::kScaleOutNs, uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count()));
}

}  // namespace rankflow::host
