// fdServe / fdFetch: the blocking fd passing of runtime/fdpass.cc, each call on the libuv thread pool
// (an AsyncWorker), settling a Promise; errors reject with an Error carrying FdPassError's code.
#include "fdpass.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "../runtime/fdpass.hpp"

namespace rankflow {
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
  const uint64_t cancels = fd_cancels(path);  // a cancel from now on ends it, started or not
  auto* w = new FdPassWorker<Nothing>(env, "rankflow.fdServe", [path, fds, clients, timeout, cancels]() {
    fd_serve(path, fds, clients, timeout, cancels);
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
  const uint64_t cancels = fd_cancels(path);  // a cancel from now on ends it, started or not
  auto* w = new FdPassWorker<std::vector<int>>(env, "rankflow.fdFetch", [path, timeout, server_pid, cancels]() {
    return fd_fetch(path, timeout, server_pid, cancels);
  });
  Napi::Promise p = w->Promise();
  w->Queue();
  return p;
}

// fdCancel(socketPath): this process's fdServe and fdFetch calls of that name reject now (STATE); how many.
Napi::Value FdCancel(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 1 || !info[0].IsString()) {  // thrown without C++ exceptions: the scratch addon (native/test-fdpass) has none
    napi_throw(env, make_error(env, "EINVAL", "fdCancel(socketPath: string): socketPath must be a string"));
    return env.Undefined();
  }
  return Napi::Number::New(env, fd_cancel(info[0].As<Napi::String>().Utf8Value()));
}

}  // namespace

}  // namespace rankflow

void RegisterFdPass(Napi::Env env, Napi::Object exports) {
  exports.Set("fdServe", Napi::Function::New(env, rankflow::FdServe, "fdServe"));
  exports.Set("fdFetch", Napi::Function::New(env, rankflow::FdFetch, "fdFetch"));
  exports.Set("fdCancel", Napi::Function::New(env, rankflow::FdCancel, "fdCancel"));
}
