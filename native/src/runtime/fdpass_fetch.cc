// SCM_RIGHTS fd passing, the client side (fd_fetch): plain POSIX, no Node-API. The wire format is
// described in fdpass_serve.cc.
#include "fdpass_socket.hpp"

namespace rankflow {
using namespace fdpass_detail;

std::vector<int> fd_fetch(const std::string& socket_path, int64_t timeout_ms, pid_t server_pid, uint64_t cancels) {
  const std::string what = "fdFetch(" + socket_path + ")";
  if (timeout_ms <= 0) throw FdPassError("EINVAL", what + ": timeoutMs must be > 0");
  const SocketAddress addr = make_address(socket_path, what);
  const int64_t start = now_ms();
  const int64_t deadline = start + timeout_ms;

  // The server may not be listening yet: refused (abstract) or missing (path) means "try again"
  // (until the deadline, or fd_cancel).
  const Cancellable registered(socket_path, what, cancels);
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
    registered.sleep(std::min(backoff, left));
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

}  // namespace rankflow
