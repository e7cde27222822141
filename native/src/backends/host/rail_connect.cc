// The scale-out leg's connect(): dialling the rail peers of lower nodes, accepting those of higher
// nodes, and the handshake that admits each connection (see rail.hpp), all in one poll loop.
#include "rail.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "rail_wire.hpp"

namespace rankflow::host {

using namespace wire;

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

}  // namespace rankflow::host
