// Scratch addon for the fd passing tests: RegisterFdPass's exports plus memfd helpers, so a test
// can make shared memory without the main addon. Not shipped.
#include <napi.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <sys/mman.h>
#include <unistd.h>

#include "fdpass.hpp"

namespace {

Napi::Value Fail(Napi::Env env, const std::string& message) {
  Napi::Error::New(env, message).ThrowAsJavaScriptException();
  return env.Undefined();
}

// memfdCreate(size): a new memfd (MFD_CLOEXEC) of `size` bytes, as the host backend makes them.
Napi::Value MemfdCreate(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 1 || !info[0].IsNumber()) return Fail(env, "memfdCreate(size: number)");
  const int64_t size = info[0].As<Napi::Number>().Int64Value();
  const int fd = ::memfd_create("rankflow-test", MFD_CLOEXEC);
  if (fd < 0) return Fail(env, std::string("memfd_create failed: ") + std::strerror(errno));
  if (::ftruncate(fd, size) != 0) {
    const int err = errno;
    ::close(fd);
    return Fail(env, std::string("ftruncate failed: ") + std::strerror(err));
  }
  return Napi::Number::New(env, fd);
}

// closeFd(fd): close(2), for fds that did not come from node:fs.
Napi::Value CloseFd(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 1 || !info[0].IsNumber()) return Fail(env, "closeFd(fd: number)");
  if (::close(info[0].As<Napi::Number>().Int32Value()) != 0)
    return Fail(env, std::string("close failed: ") + std::strerror(errno));
  return env.Undefined();
}

Napi::Object Init(Napi::Env env, Napi::Object exports) {
  RegisterFdPass(env, exports);
  exports.Set("memfdCreate", Napi::Function::New(env, MemfdCreate, "memfdCreate"));
  exports.Set("closeFd", Napi::Function::New(env, CloseFd, "closeFd"));
  return exports;
}

}  // namespace

NODE_API_MODULE(rankflow_fdpass_test, Init)
