// File-descriptor passing between processes of one host (SCM_RIGHTS over a Unix stream socket).
// A rank's symmetric memory is a set of fds (memfds on the host backend, cuMem POSIX-fd handles on
// cuda); ranks in other processes import them after receiving them here. pidfd_getfd would avoid
// the socket but fails under ptrace restrictions (Yama, containers), so it is not used.
//
// fd_serve and fd_fetch block and throw FdPassError; binding/fdpass.cc runs them on the libuv pool
// as `fdServe` and `fdFetch`.
#pragma once

#include <stdexcept>
#include <sys/types.h>
#include <string>
#include <vector>

namespace rankflow {

// `code` is one of rankflow's public error codes: EINVAL (bad argument, failed syscall) or
// TIMEOUT_CPU (a peer never came); the JS side rejects with an Error carrying the same `code`.
struct FdPassError : std::runtime_error {
  std::string code;
  FdPassError(std::string code, const std::string& message)
      : std::runtime_error(message), code(std::move(code)) {}
};

// Socket names: "@name" is the Linux abstract namespace (no file, gone with the last close, scoped
// to the network namespace); anything else is a filesystem path, unlinked by the server when done.
// Serves `fds` once to each entry of `clients` (pids, checked with SO_PEERCRED; a pid listed twice
// may fetch twice), then returns; throws after `timeout_ms`. Any other process that connects is
// refused, is not counted as a client, and is named in the timeout's message.
// `cancels`: fd_cancels(socket_path) as the call was made (binding/fdpass.cc: on the JS thread, before
// the work waits for a pool thread): a cancel issued after it ends the call even before it starts.
void fd_serve(const std::string& socket_path, const std::vector<int>& fds, const std::vector<pid_t>& clients,
              int64_t timeout_ms, uint64_t cancels = 0);

// Ends this process's fd_serve and fd_fetch calls of `socket_path` made before it, now (each throws
// STATE "cancelled"; a fetch while it waits for its server to listen), also those not started yet;
// returns how many were running. A join that ended need not hold a thread until its timeout for
// clients or a server that will not come. Calls made after it are not affected.
int fd_cancel(const std::string& socket_path);
// How many fd_cancels of `socket_path` there were so far (what a call made now passes as `cancels`).
uint64_t fd_cancels(const std::string& socket_path);

// Connects (retrying until the server is up or `timeout_ms` has passed) and returns the received
// fds, opened O_CLOEXEC. With `server_pid` > 0, a server that is another process is refused.
// On any error no received fd stays open.
std::vector<int> fd_fetch(const std::string& socket_path, int64_t timeout_ms, pid_t server_pid = 0, uint64_t cancels = 0);

}  // namespace rankflow
