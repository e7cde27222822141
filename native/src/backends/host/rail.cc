// The scale-out leg of the host backend: listening, the exchange of frames, and closing (see
// rail.hpp); the handshake of connect() is in rail_connect.cc.
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
  const double timeout = kind == WaitKind::Cpu || c_.rules.device_is_cpu ? c_.rules.cpu_timeout_s : c_.rules.gpu_timeout_s;
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
    // Released halfway, the streams hold parts of frames: the connections cannot be used again.
    if (c_.abort.released(seq)) {
      const Error e = release_error(c_.abort, c_.rank(), seq, phase_name(phase));
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
