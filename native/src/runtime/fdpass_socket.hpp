// The socket helpers and wire constants that fdpass_serve.cc and fdpass_fetch.cc share (internal).
#pragma once

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
#include <string>
#include <type_traits>
#include <utility>

namespace rankflow {
namespace fdpass_detail {

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

[[noreturn]] inline void sys_fail(const std::string& what, const std::string& call, int err) {
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

// A running fd_serve or fd_fetch of one socket name, registered for fd_cancel (fdpass_serve.cc keeps
// the registry): an eventfd it polls beside its socket (or sleeps on between connects); `cancelled()`
// throws STATE once fd_cancel wrote it.
class Cancellable {
 public:
  // Throws at once if `path` was cancelled more than `cancels` times (a cancel after the call was made).
  Cancellable(const std::string& path, const std::string& what, uint64_t cancels);
  ~Cancellable();
  Cancellable(const Cancellable&) = delete;
  Cancellable& operator=(const Cancellable&) = delete;
  int fd() const { return wake_.get(); }
  // Waits up to `ms` for a cancel (the sleep between a fetch's connects); throws if one came.
  void sleep(int64_t ms) const;
  [[noreturn]] void cancelled(const std::string& detail) const;

 private:
  const std::string path_;
  const std::string what_;
  Fd wake_;
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

inline int64_t now_ms() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

struct SocketAddress {
  sockaddr_un addr{};
  socklen_t len = 0;
  bool abstract = false;
};

inline SocketAddress make_address(const std::string& name, const std::string& what) {
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
inline bool wait_for(int fd, short events, int64_t deadline, const std::string& what) {
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
inline pid_t check_peer_uid(int fd, const std::string& what) {
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
inline int try_send_exact(int fd, const void* data, size_t size) {
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

inline void send_exact(int fd, const void* data, size_t size, const std::string& what) {
  if (const int err = try_send_exact(fd, data, size)) sys_fail(what, "send", err);
}

// Reads exactly `size` plain bytes (no fds may ride on them) before the deadline.
inline void recv_exact(int fd, void* data, size_t size, int64_t deadline, const std::string& what,
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
[[noreturn]] inline void client_send_fail(pid_t pid, const std::string& what, const std::string& call, int err) {
  if (err == EPIPE || err == ECONNRESET)
    throw FdPassError("EINVAL", "client pid " + std::to_string(pid) + " closed the connection before acknowledging (" +
                                    call + ": " + std::strerror(err) + ")");
  sys_fail(what, call + " to client pid " + std::to_string(pid), err);
}

inline void send_fds(int sock, pid_t pid, const std::vector<int>& fds, int64_t deadline, const std::string& what) {
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
inline void refuse(int sock, pid_t pid) {
  const Header h{kMagic, kVersion, kRefused, uint32_t(pid)};
  (void)try_send_exact(sock, &h, sizeof(h));
}

}  // namespace fdpass_detail
}  // namespace rankflow
