// fdServe / fdFetch for JavaScript: runtime/fdpass.hpp's blocking calls on the libuv thread pool.
#pragma once

#include <napi.h>

// Exports fdServe(socketPath, fds, clients: pid[], timeoutMs): Promise<void> and
// fdFetch(socketPath, timeoutMs, serverPid?): Promise<number[]>. Both run on the libuv thread pool.
// Declared at global scope and re-exported into rankflow:: so addon.cc may call it either way.
void RegisterFdPass(Napi::Env env, Napi::Object exports);
namespace rankflow {
using ::RegisterFdPass;
}
