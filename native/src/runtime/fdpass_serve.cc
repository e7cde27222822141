// SCM_RIGHTS fd passing, the server side (fd_serve): plain POSIX, no Node-API (binding/fdpass.cc
// wraps it for JavaScript). See fdpass.hpp for the socket naming rules.
//
// Wire format on one Unix stream connection, server -> client:
//   Header { magic, version, count, chunk }            plain bytes, no fds
//   ceil(count / chunk) x { uint32 n } + n fds          one sendmsg each, SCM_RIGHTS
// then client -> server: one ack byte once every fd is installed, so "served" means received.
// A client that is not one of the server's `clients` (by SO_PEERCRED pid) gets only
//   Header { magic, version, kRefused, its pid as the server sees it }
// and the connection is closed: an abstract name is visible to every local process
// (/proc/net/unix), and a rank's memory is for the processes of its world only.
#include "fdpass_socket.hpp"

#include <mutex>
#include <sys/eventfd.h>

namespace rankflow {
using namespace fdpass_detail;

namespace {
// The serves and fetches running in this process, by socket name: an eventfd each (Cancellable).
std::mutex cancel_mu;
std::multimap<std::string, int>& running() {
  static std::multimap<std::string, int> m;
  return m;
}
std::map<std::string, uint64_t>& cancels_of() {  // a few names a join, kept for the process's life
  static std::map<std::string, uint64_t> m;
  return m;
}
}  // namespace

Cancellable::Cancellable(const std::string& path, const std::string& what, uint64_t cancels)
    : path_(path), what_(what), wake_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
  if (wake_.get() < 0) sys_fail(what, "eventfd", errno);
  std::lock_guard<std::mutex> lock(cancel_mu);
  auto c = cancels_of().find(path_);
  if (c != cancels_of().end() && c->second > cancels) cancelled("before it started");
  running().emplace(path_, wake_.get());
}

Cancellable::~Cancellable() {
  std::lock_guard<std::mutex> lock(cancel_mu);
  auto [lo, hi] = running().equal_range(path_);
  for (auto it = lo; it != hi; ++it)
    if (it->second == wake_.get()) {
      running().erase(it);
      break;
    }
}

void Cancellable::sleep(int64_t ms) const {
  pollfd p{wake_.get(), POLLIN, 0};
  while (::poll(&p, 1, int(ms)) < 0 && errno == EINTR) {
  }
  if (p.revents != 0) cancelled("while it waited for the server");
}

void Cancellable::cancelled(const std::string& detail) const { throw FdPassError("STATE", what_ + ": cancelled " + detail); }

uint64_t fd_cancels(const std::string& socket_path) {
  std::lock_guard<std::mutex> lock(cancel_mu);
  auto c = cancels_of().find(socket_path);
  return c == cancels_of().end() ? 0 : c->second;
}

int fd_cancel(const std::string& socket_path) {
  std::lock_guard<std::mutex> lock(cancel_mu);
  ++cancels_of()[socket_path];
  int n = 0;
  const uint64_t one = 1;
  auto [lo, hi] = running().equal_range(socket_path);
  for (auto it = lo; it != hi; ++it) n += ::write(it->second, &one, sizeof one) == ssize_t(sizeof one) ? 1 : 0;
  return n;
}

void fd_serve(const std::string& socket_path, const std::vector<int>& fds, const std::vector<pid_t>& clients,
              int64_t timeout_ms, uint64_t cancels) {
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
  const Cancellable registered(socket_path, what, cancels);

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
    polls.push_back({registered.fd(), POLLIN, 0});
    const int r = ::poll(polls.data(), polls.size(), int(std::min<int64_t>(left, 1 << 30)));
    if (r < 0) {
      if (errno == EINTR) continue;
      sys_fail(what, "poll", errno);
    }
    if (r == 0) continue;
    if (polls.back().revents != 0)
      registered.cancelled("after " + std::to_string(now_ms() - start) + " ms with " + std::to_string(served) + " of " +
                           std::to_string(expected_clients) + " clients served");

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

}  // namespace rankflow
