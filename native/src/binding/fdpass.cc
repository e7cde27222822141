// SCM_RIGHTS fd passing: the server side (fd_serve), the client side (fd_fetch), and their
// AsyncWorker bindings. See fdpass.hpp for the socket naming rules.
//
// Wire format on one Unix stream connection, server -> client:
//   Header { magic, version, count, chunk }            plain bytes, no fds
//   ceil(count / chunk) x { uint32 n } + n fds          one sendmsg each, SCM_RIGHTS
// then client -> server: one ack byte once every fd is installed, so "served" means received.
// A client that is not one of the server's `clients` (by SO_PEERCRED pid) gets only
//   Header { magic, version, kRefused, its pid as the server sees it }
// and the connection is closed: an abstract name is visible to every local process
// (/proc/net/unix), and a rank's memory is for the processes of its world only.
#include "fdpass.hpp"

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <map>
#include <type_traits>
#include <utility>

namespace rankflow {
namespace {

// SCM_MAX_FD in the kernel (include/net/scm.h): sendmsg refuses more fds in one message (EINVAL).
constexpr int kMaxFdsPerMessage = 253;
// A header from a stranger on the socket must not make us allocate or wait for millions of fds.
constexpr uint32_t kMaxFds = 1u << 16;
constexpr uint32_t kMagic = 0x50464652;  // "RFFP" little-endian
constexpr uint32_t kVersion = 1;
constexpr uint8_t kAck = 0xAC;
// `count` of the refusal header: more than kMaxFds, so an old client reports it as implausible.
constexpr uint32_t kRefused = 0xFFFFFFFFu;
// Client reconnect backoff: the server usually comes up within milliseconds, so start small.
constexpr int64_t kFirstBackoffMs = 5;
constexpr int64_t kMaxBackoffMs = 200;

struct Header {
  uint32_t magic;
  uint32_t version;
  uint32_t count;  // fds in total
  uint32_t chunk;  // fds per message, at most kMaxFdsPerMessage
};

// Room for one chunk's SCM_RIGHTS message, aligned as the cmsg macros expect.
union ControlBuffer {
  char bytes[CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)];
  cmsghdr align;
};

[[noreturn]] void sys_fail(const std::string& what, const std::string& call, int err) {
  throw FdPassError("EINVAL", what + ": " + call + " failed: " + std::strerror(err));
}

// Owns one fd; closes it unless released.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  int get() const { return fd_; }
  void reset() {
    if (fd_ >= 0) ::close(fd_);  // close's error is not actionable here: the fd is gone either way
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

// Owns the fds received so far: an error half way through closes every one of them.
class ReceivedFds {
 public:
  ReceivedFds() = default;
  ReceivedFds(const ReceivedFds&) = delete;
  ReceivedFds& operator=(const ReceivedFds&) = delete;
  ~ReceivedFds() {
    for (int fd : fds_) ::close(fd);
  }
  void push(int fd) { fds_.push_back(fd); }
  size_t size() const { return fds_.size(); }
  std::vector<int> release() { return std::exchange(fds_, {}); }

 private:
  std::vector<int> fds_;
};

int64_t now_ms() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

struct SocketAddress {
  sockaddr_un addr{};
  socklen_t len = 0;
  bool abstract = false;
};

SocketAddress make_address(const std::string& name, const std::string& what) {
  SocketAddress a;
  a.addr.sun_family = AF_UNIX;
  if (name.empty() || name == "@")
    throw FdPassError("EINVAL", what + ": socketPath is empty; pass \"@name\" (abstract) or a path");
  if (name.find('\0') != std::string::npos)
    throw FdPassError("EINVAL", what + ": socketPath contains a NUL character");
  a.abstract = name[0] == '@';
  // Abstract names are not NUL-terminated: the address length says where they end.
  const std::string body = a.abstract ? name.substr(1) : name;
  const size_t room = sizeof(a.addr.sun_path) - 1;
  if (body.size() > room)
    throw FdPassError("EINVAL", what + ": socketPath is " + std::to_string(body.size()) +
                                    " bytes, a Unix socket name holds at most " + std::to_string(room));
  if (a.abstract) {
    a.addr.sun_path[0] = '\0';
    std::memcpy(a.addr.sun_path + 1, body.data(), body.size());
    a.len = socklen_t(offsetof(sockaddr_un, sun_path) + 1 + body.size());
  } else {
    std::memcpy(a.addr.sun_path, body.data(), body.size());
    a.len = socklen_t(offsetof(sockaddr_un, sun_path) + body.size() + 1);
  }
  return a;
}

// Waits for `events` on fd until the deadline; false on timeout.
bool wait_for(int fd, short events, int64_t deadline, const std::string& what) {
  for (;;) {
    const int64_t left = deadline - now_ms();
    if (left <= 0) return false;
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, int(std::min<int64_t>(left, 1 << 30)));
    if (r > 0) return true;
    if (r < 0 && errno != EINTR) sys_fail(what, "poll", errno);
  }
}

// Both ends run as the same user: anything else on an abstract name (which any local user can
// bind or connect to) is not a rankflow peer, and must neither get nor give memory handles.
// Returns the peer's pid, for messages.
pid_t check_peer_uid(int fd, const std::string& what) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) sys_fail(what, "getsockopt(SO_PEERCRED)", errno);
  if (cred.uid != ::geteuid())
    throw FdPassError("EINVAL", what + ": peer pid " + std::to_string(cred.pid) + " runs as uid " +
                                    std::to_string(cred.uid) + ", not " + std::to_string(::geteuid()) +
                                    "; refusing to exchange fds with another user");
  return cred.pid;
}

// Sends all of `data`; returns 0 or the errno of the failed send.
int try_send_exact(int fd, const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t r = ::send(fd, p, size, MSG_NOSIGNAL);
    if (r < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    p += r;
    size -= size_t(r);
  }
  return 0;
}

void send_exact(int fd, const void* data, size_t size, const std::string& what) {
  if (const int err = try_send_exact(fd, data, size)) sys_fail(what, "send", err);
}

// Reads exactly `size` plain bytes (no fds may ride on them) before the deadline.
void recv_exact(int fd, void* data, size_t size, int64_t deadline, const std::string& what,
                const char* part) {
  char* p = static_cast<char*>(data);
  size_t got = 0;
  while (got < size) {
    if (!wait_for(fd, POLLIN, deadline, what))
      throw FdPassError("TIMEOUT_CPU", what + ": timed out reading the " + part + " (" +
                                           std::to_string(got) + " of " + std::to_string(size) + " bytes)");
    const ssize_t r = ::recv(fd, p + got, size - got, MSG_DONTWAIT);
    if (r == 0)
      throw FdPassError("EINVAL", what + ": the peer closed the connection in the " + part + " (" +
                                      std::to_string(got) + " of " + std::to_string(size) + " bytes)");
    if (r < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      sys_fail(what, "recv", errno);
    }
    got += size_t(r);
  }
}

// A client gone mid-send is not a server failure: say so in the words the ack path uses.
[[noreturn]] void client_send_fail(pid_t pid, const std::string& what, const std::string& call, int err) {
  if (err == EPIPE || err == ECONNRESET)
    throw FdPassError("EINVAL", "client pid " + std::to_string(pid) + " closed the connection before acknowledging (" +
                                    call + ": " + std::strerror(err) + ")");
  sys_fail(what, call + " to client pid " + std::to_string(pid), err);
}

void send_fds(int sock, pid_t pid, const std::vector<int>& fds, int64_t deadline, const std::string& what) {
  // Bound a send to a client that stopped reading; the data is tiny, so this never fires normally.
  const int64_t left = std::max<int64_t>(deadline - now_ms(), 1);
  timeval tv{time_t(left / 1000), suseconds_t((left % 1000) * 1000)};
  if (::setsockopt(sock, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) != 0) sys_fail(what, "setsockopt(SO_SNDTIMEO)", errno);

  const Header h{kMagic, kVersion, uint32_t(fds.size()), uint32_t(kMaxFdsPerMessage)};
  if (const int err = try_send_exact(sock, &h, sizeof(h))) client_send_fail(pid, what, "send", err);
  for (size_t i = 0; i < fds.size(); i += kMaxFdsPerMessage) {
    const uint32_t n = uint32_t(std::min<size_t>(kMaxFdsPerMessage, fds.size() - i));
    uint32_t body = n;
    iovec iov{&body, sizeof(body)};
    ControlBuffer control{};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.bytes;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * n);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * n);
    std::memcpy(CMSG_DATA(c), fds.data() + i, sizeof(int) * n);
    ssize_t r;
    do r = ::sendmsg(sock, &msg, MSG_NOSIGNAL);
    while (r < 0 && errno == EINTR);
    if (r < 0) client_send_fail(pid, what, "sendmsg(SCM_RIGHTS, " + std::to_string(n) + " fds)", errno);
    // The fds travel with the first byte; the rest of a short write is plain data.
    if (size_t(r) < sizeof(body)) {
      if (const int err = try_send_exact(sock, reinterpret_cast<char*>(&body) + r, sizeof(body) - size_t(r)))
        client_send_fail(pid, what, "send", err);
    }
  }
}

struct PendingClient {
  Fd fd;
  pid_t pid = 0;
};

// The pids the server may serve, each as many times as it is listed: a slot is taken when the
// fds are sent and given back if that client fails before acknowledging.
class AllowedClients {
 public:
  explicit AllowedClients(const std::vector<pid_t>& pids) {
    for (pid_t p : pids) ++slots_[p];
  }
  bool take(pid_t pid) {
    auto it = slots_.find(pid);
    if (it == slots_.end() || it->second == 0) return false;
    --it->second;
    return true;
  }
  void give_back(pid_t pid) { ++slots_[pid]; }

 private:
  std::map<pid_t, int> slots_;
};

// Tells a client outside the world that it gets nothing, and why (best effort: it may be gone).
void refuse(int sock, pid_t pid) {
  const Header h{kMagic, kVersion, kRefused, uint32_t(pid)};
  (void)try_send_exact(sock, &h, sizeof(h));
}

}  // namespace

void fd_serve(const std::string& socket_path, const std::vector<int>& fds, const std::vector<pid_t>& clients,
              int64_t timeout_ms) {
  const std::string what = "fdServe(" + socket_path + ")";
  for (pid_t p : clients)
    if (p <= 0) throw FdPassError("EINVAL", what + ": clients must be pids > 0, got " + std::to_string(p));
  const int expected_clients = int(clients.size());
  if (timeout_ms <= 0) throw FdPassError("EINVAL", what + ": timeoutMs must be > 0");
  if (fds.size() > kMaxFds)
    throw FdPassError("EINVAL", what + ": " + std::to_string(fds.size()) + " fds, at most " + std::to_string(kMaxFds));
  const SocketAddress addr = make_address(socket_path, what);
  const int64_t start = now_ms();
  const int64_t deadline = start + timeout_ms;
  if (expected_clients == 0) return;

  // Non-blocking so that a client that vanishes between poll and accept cannot block us.
  Fd listener(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (listener.get() < 0) sys_fail(what, "socket(AF_UNIX)", errno);
  if (::bind(listener.get(), reinterpret_cast<const sockaddr*>(&addr.addr), addr.len) != 0) {
    const int err = errno;
    if (err == EADDRINUSE)
      throw FdPassError("EINVAL", what + ": bind failed: " + std::strerror(err) +
                                      " (another server holds this name, or a stale socket file is left: pick a fresh name)");
    sys_fail(what, "bind", err);
  }
  // Unlink only what we bound ourselves, never a name we failed to take.
  struct Unlink {
    const SocketAddress& a;
    ~Unlink() {
      if (!a.abstract) ::unlink(a.addr.sun_path);
    }
  } unlink_guard{addr};
  if (::listen(listener.get(), 128) != 0) sys_fail(what, "listen", errno);

  AllowedClients allowed(clients);
  std::vector<PendingClient> pending;  // sent everything, waiting for the ack
  int served = 0;
  int refused = 0;
  pid_t last_refused = 0;
  std::string last_client_error;
  while (served < expected_clients) {
    const int64_t left = deadline - now_ms();
    if (left <= 0) {
      std::string msg = what + ": timed out after " + std::to_string(now_ms() - start) + " ms with " +
                        std::to_string(served) + " of " + std::to_string(expected_clients) + " clients served";
      if (!pending.empty()) msg += " (" + std::to_string(pending.size()) + " connected but never acknowledged)";
      if (refused > 0)
        msg += "; refused " + std::to_string(refused) + " connection" + (refused == 1 ? "" : "s") +
               " from processes outside the world (last: pid " + std::to_string(last_refused) + ")";
      if (!last_client_error.empty()) msg += "; last client error: " + last_client_error;
      throw FdPassError("TIMEOUT_CPU", msg);
    }
    std::vector<pollfd> polls;
    polls.push_back({listener.get(), POLLIN, 0});
    for (const auto& c : pending) polls.push_back({c.fd.get(), POLLIN, 0});
    const int r = ::poll(polls.data(), polls.size(), int(std::min<int64_t>(left, 1 << 30)));
    if (r < 0) {
      if (errno == EINTR) continue;
      sys_fail(what, "poll", errno);
    }
    if (r == 0) continue;

    // Acks first (indices match `pending` before accepting appends to it).
    std::vector<PendingClient> still;
    for (size_t i = 0; i < pending.size(); ++i) {
      if (polls[i + 1].revents == 0) {
        still.push_back(std::move(pending[i]));
        continue;
      }
      uint8_t ack = 0;
      const ssize_t n = ::recv(pending[i].fd.get(), &ack, 1, MSG_DONTWAIT);
      if (n == 1 && ack == kAck) {
        ++served;
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
        still.push_back(std::move(pending[i]));
      } else {
        allowed.give_back(pending[i].pid);
        // A client that closes with fds still queued resets the connection instead of a clean EOF.
        const bool closed = n == 0 || (n < 0 && errno == ECONNRESET);
        last_client_error = "client pid " + std::to_string(pending[i].pid) +
                            (closed  ? std::string(" closed the connection before acknowledging")
                             : n < 0 ? std::string(": recv failed: ") + std::strerror(errno)
                                     : std::string(" sent a bad acknowledgement"));
      }
    }
    pending = std::move(still);

    if (polls[0].revents & POLLIN) {
      for (;;) {
        Fd client(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
        if (client.get() < 0) {
          const int err = errno;
          if (err == EAGAIN || err == EWOULDBLOCK) break;
          if (err == EINTR || err == ECONNABORTED) continue;
          sys_fail(what, "accept4", err);  // EMFILE and the like: we cannot serve anyone
        }
        // A failing client is reported in the end, not fatal: others may still come and be served.
        // A refused one does not count as a client at all.
        pid_t pid = 0;
        try {
          pid = check_peer_uid(client.get(), what);
          if (!allowed.take(pid)) {
            refuse(client.get(), pid);
            ++refused;
            last_refused = pid;
            continue;
          }
          send_fds(client.get(), pid, fds, deadline, what);
          pending.push_back({std::move(client), pid});
        } catch (const FdPassError& e) {
          if (pid > 0) allowed.give_back(pid);
          last_client_error = e.what();
        }
      }
    }
  }
}

std::vector<int> fd_fetch(const std::string& socket_path, int64_t timeout_ms, pid_t server_pid) {
  const std::string what = "fdFetch(" + socket_path + ")";
  if (timeout_ms <= 0) throw FdPassError("EINVAL", what + ": timeoutMs must be > 0");
  const SocketAddress addr = make_address(socket_path, what);
  const int64_t start = now_ms();
  const int64_t deadline = start + timeout_ms;

  // The server may not be listening yet: refused (abstract) or missing (path) means "try again".
  Fd sock;
  int64_t backoff = kFirstBackoffMs;
  int attempts = 0;
  for (;;) {
    sock = Fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (sock.get() < 0) sys_fail(what, "socket(AF_UNIX)", errno);
    ++attempts;
    if (::connect(sock.get(), reinterpret_cast<const sockaddr*>(&addr.addr), addr.len) == 0) break;
    const int err = errno;
    if (err != ECONNREFUSED && err != ENOENT && err != EAGAIN && err != EINTR) sys_fail(what, "connect", err);
    sock.reset();
    const int64_t left = deadline - now_ms();
    if (left <= 0)
      throw FdPassError("TIMEOUT_CPU", what + ": no server after " + std::to_string(now_ms() - start) + " ms (" +
                                           std::to_string(attempts) + " attempts, last connect: " +
                                           std::strerror(err) + ")");
    const int64_t sleep_ms = std::min(backoff, left);
    timespec ts{time_t(sleep_ms / 1000), long((sleep_ms % 1000) * 1000000)};
    while (::nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
    backoff = std::min(backoff * 2, kMaxBackoffMs);
  }
  const pid_t server = check_peer_uid(sock.get(), what);
  if (server_pid > 0 && server != server_pid)
    throw FdPassError("EINVAL", what + ": the server is pid " + std::to_string(server) + ", not pid " +
                                    std::to_string(server_pid) + " (the process that announced this socket); refusing its fds");

  Header h{};
  recv_exact(sock.get(), &h, sizeof(h), deadline, what, "header");
  if (h.magic != kMagic || h.version != kVersion)
    throw FdPassError("EINVAL", what + ": the server does not speak rankflow fd passing v" + std::to_string(kVersion) +
                                    " (magic " + std::to_string(h.magic) + ", version " + std::to_string(h.version) + ")");
  if (h.count == kRefused)
    throw FdPassError("EINVAL", what + ": the server (pid " + std::to_string(server) +
                                    ") refused this process: it serves only the processes of its world, and pid " +
                                    std::to_string(h.chunk) + " (this process, as the server sees it) is not one of them");
  if (h.count > kMaxFds || h.chunk == 0 || h.chunk > uint32_t(kMaxFdsPerMessage))
    throw FdPassError("EINVAL", what + ": implausible header (count " + std::to_string(h.count) + ", chunk " +
                                    std::to_string(h.chunk) + ")");

  ReceivedFds received;
  while (received.size() < h.count) {
    if (!wait_for(sock.get(), POLLIN, deadline, what))
      throw FdPassError("TIMEOUT_CPU", what + ": timed out after " + std::to_string(now_ms() - start) + " ms with " +
                                           std::to_string(received.size()) + " of " + std::to_string(h.count) +
                                           " fds received");
    uint32_t body = 0;
    iovec iov{&body, sizeof(body)};
    ControlBuffer control{};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.bytes;
    msg.msg_controllen = sizeof(control.bytes);
    const ssize_t r = ::recvmsg(sock.get(), &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (r < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      sys_fail(what, "recvmsg", errno);
    }
    if (r == 0)
      throw FdPassError("EINVAL", what + ": the server closed the connection after " +
                                      std::to_string(received.size()) + " of " + std::to_string(h.count) + " fds");
    // Take ownership of whatever arrived before judging it, so that an error closes it too.
    size_t arrived = 0;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t k = 0; k < n; ++k) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(c) + k * sizeof(int), sizeof(int));
        received.push(fd);
      }
      arrived += n;
    }
    // The kernel truncates (and drops fds) when our buffer is short or RLIMIT_NOFILE is reached.
    if (msg.msg_flags & MSG_CTRUNC)
      throw FdPassError("EINVAL", what + ": recvmsg truncated the SCM_RIGHTS data after " +
                                      std::to_string(received.size()) + " of " + std::to_string(h.count) +
                                      " fds (open-file limit reached? see ulimit -n)");
    if (size_t(r) < sizeof(body))
      recv_exact(sock.get(), reinterpret_cast<char*>(&body) + r, sizeof(body) - size_t(r), deadline, what, "chunk size");
    if (body != arrived || body == 0 || body > h.chunk || received.size() > h.count)
      throw FdPassError("EINVAL", what + ": a message announced " + std::to_string(body) + " fds and carried " +
                                      std::to_string(arrived) + " (" + std::to_string(received.size()) + " of " +
                                      std::to_string(h.count) + " so far)");
  }
  send_exact(sock.get(), &kAck, 1, what);
  return received.release();
}

namespace {

Napi::Value make_error(Napi::Env env, const std::string& code, const std::string& message) {
  Napi::Error e = Napi::Error::New(env, message);
  e.Value().Set("code", Napi::String::New(env, code));
  return e.Value();
}

Napi::Value rejected(Napi::Env env, const std::string& message) {
  auto d = Napi::Promise::Deferred::New(env);
  d.Reject(make_error(env, "EINVAL", message));
  return d.Promise();
}

// Runs one blocking call on the thread pool and settles a promise with its result.
template <typename Result>
class FdPassWorker : public Napi::AsyncWorker {
 public:
  using Body = std::function<Result()>;
  FdPassWorker(Napi::Env env, const char* name, Body body)
      : Napi::AsyncWorker(env, name), deferred_(Napi::Promise::Deferred::New(env)), body_(std::move(body)) {}
  Napi::Promise Promise() { return deferred_.Promise(); }

 protected:
  void Execute() override {
    try {
      result_ = body_();
    } catch (const FdPassError& e) {
      failed_ = true;
      code_ = e.code;
      message_ = e.what();
    } catch (const std::exception& e) {
      failed_ = true;
      code_ = "EINVAL";
      message_ = e.what();
    }
  }
  // Errors are settled here (not through SetError) so that they keep their rankflow code.
  void OnOK() override {
    Napi::Env env = Env();
    if (failed_) {
      deferred_.Reject(make_error(env, code_, message_));
      return;
    }
    if constexpr (std::is_same_v<Result, std::vector<int>>) {
      Napi::Array out = Napi::Array::New(env, result_.size());
      for (size_t i = 0; i < result_.size(); ++i) out.Set(uint32_t(i), Napi::Number::New(env, result_[i]));
      deferred_.Resolve(out);
    } else {
      deferred_.Resolve(env.Undefined());
    }
  }

 private:
  Napi::Promise::Deferred deferred_;
  Body body_;
  Result result_{};
  bool failed_ = false;
  std::string code_, message_;
};

struct Nothing {};

bool read_timeout(const Napi::Value& v, int64_t* out) {
  if (!v.IsNumber()) return false;
  const double d = v.As<Napi::Number>().DoubleValue();
  if (!(d > 0) || d > 1e12) return false;  // also rejects NaN
  *out = int64_t(d);
  return *out > 0;
}

Napi::Value FdServe(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const char* usage = "fdServe(socketPath: string, fds: number[], clients: number[], timeoutMs: number)";
  if (info.Length() < 4 || !info[0].IsString() || !info[1].IsArray() || !info[2].IsArray())
    return rejected(env, std::string(usage) + ": bad arguments");
  const std::string path = info[0].As<Napi::String>().Utf8Value();
  const std::string what = "fdServe(" + path + ")";
  Napi::Array arr = info[1].As<Napi::Array>();
  std::vector<int> fds;
  fds.reserve(arr.Length());
  for (uint32_t i = 0; i < arr.Length(); ++i) {
    Napi::Value v = arr.Get(i);
    const double d = v.IsNumber() ? v.As<Napi::Number>().DoubleValue() : -1;
    if (!(d >= 0) || d != double(int(d)))
      return rejected(env, what + ": fds[" + std::to_string(i) + "] is not a non-negative integer");
    // Catch a closed fd here, with its index, rather than as EBADF from sendmsg later.
    if (::fcntl(int(d), F_GETFD) < 0)
      return rejected(env, what + ": fds[" + std::to_string(i) + "] = " + std::to_string(int(d)) +
                               ": fcntl(F_GETFD) failed: " + std::strerror(errno));
    fds.push_back(int(d));
  }
  Napi::Array pids = info[2].As<Napi::Array>();
  std::vector<pid_t> clients;
  clients.reserve(pids.Length());
  for (uint32_t i = 0; i < pids.Length(); ++i) {
    Napi::Value v = pids.Get(i);
    const double d = v.IsNumber() ? v.As<Napi::Number>().DoubleValue() : -1;
    if (!(d >= 1) || d > double(INT32_MAX) || d != double(int(d)))
      return rejected(env, what + ": clients[" + std::to_string(i) + "] is not a pid (an integer >= 1)");
    clients.push_back(pid_t(d));
  }
  int64_t timeout = 0;
  if (!read_timeout(info[3], &timeout)) return rejected(env, what + ": timeoutMs must be a number > 0");
  // The caller keeps `fds` open until the promise settles; we neither dup nor close them.
  auto* w = new FdPassWorker<Nothing>(env, "rankflow.fdServe", [path, fds, clients, timeout]() {
    fd_serve(path, fds, clients, timeout);
    return Nothing{};
  });
  Napi::Promise p = w->Promise();
  w->Queue();
  return p;
}

Napi::Value FdFetch(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 2 || !info[0].IsString())
    return rejected(env, "fdFetch(socketPath: string, timeoutMs: number, serverPid?: number): bad arguments");
  const std::string path = info[0].As<Napi::String>().Utf8Value();
  int64_t timeout = 0;
  if (!read_timeout(info[1], &timeout)) return rejected(env, "fdFetch(" + path + "): timeoutMs must be a number > 0");
  pid_t server_pid = 0;
  if (info.Length() >= 3 && !info[2].IsUndefined()) {
    const double d = info[2].IsNumber() ? info[2].As<Napi::Number>().DoubleValue() : -1;
    if (!(d >= 1) || d > double(INT32_MAX) || d != double(int(d)))
      return rejected(env, "fdFetch(" + path + "): serverPid is not a pid (an integer >= 1)");
    server_pid = pid_t(d);
  }
  auto* w = new FdPassWorker<std::vector<int>>(env, "rankflow.fdFetch",
                                               [path, timeout, server_pid]() { return fd_fetch(path, timeout, server_pid); });
  Napi::Promise p = w->Promise();
  w->Queue();
  return p;
}

}  // namespace

}  // namespace rankflow

void RegisterFdPass(Napi::Env env, Napi::Object exports) {
  exports.Set("fdServe", Napi::Function::New(env, rankflow::FdServe, "fdServe"));
  exports.Set("fdFetch", Napi::Function::New(env, rankflow::FdFetch, "fdFetch"));
}
