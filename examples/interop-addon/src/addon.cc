// The example addon's binding (node-addon-api): what a rank program needs to run its own CUDA work
// beside rankflow's. Addresses cross as BigInts, as rankflow hands them out (rank.cudaStream(),
// tensor.ptr, rank.recordEvent()):
//   scaleRows(dst, src, factors, rows, hidden, stream, delayNs = 0)  the kernel of scale.cu on `stream`
//   new DeviceBuffer(bytes, stream)  memory of the application's own (cudaMallocAsync on `stream`);
//       .ptr, .bytes, .free() (cudaFreeAsync on that stream; also when garbage-collected)
//   createStream() / destroyStream(s) / syncStream(s)   a non-blocking stream of its own
//   createEvent() / recordEvent(e, s) / streamWaitEvent(s, e) / destroyEvent(e)
//   currentContext() / streamContext(s)   the CUcontext current on this thread / of a stream
// Every CUDA failure is thrown as an Error naming the call and the CUDA error.
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <napi.h>

#include <string>

#include "scale.cuh"

namespace {

void check(Napi::Env env, cudaError_t e, const char* call) {
  if (e != cudaSuccess) throw Napi::Error::New(env, std::string(call) + " failed: " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

uint64_t address(const Napi::Value& v, const char* name) {
  if (!v.IsBigInt()) throw Napi::TypeError::New(v.Env(), std::string(name) + " must be a BigInt (an address)");
  bool lossless = true;
  const uint64_t a = v.As<Napi::BigInt>().Uint64Value(&lossless);
  if (!lossless) throw Napi::RangeError::New(v.Env(), std::string(name) + " is not a 64-bit address");
  return a;
}

int64_t integer(const Napi::Value& v, const char* name) {
  if (!v.IsNumber()) throw Napi::TypeError::New(v.Env(), std::string(name) + " must be a number");
  const double d = v.As<Napi::Number>().DoubleValue();
  if (!(d >= 0) || d != double(int64_t(d))) throw Napi::RangeError::New(v.Env(), std::string(name) + " must be a non-negative integer");
  return int64_t(d);
}

template <typename T>
T* ptr(uint64_t a) { return reinterpret_cast<T*>(uintptr_t(a)); }
cudaStream_t stream_of(uint64_t a) { return reinterpret_cast<cudaStream_t>(uintptr_t(a)); }
cudaEvent_t event_of(uint64_t a) { return reinterpret_cast<cudaEvent_t>(uintptr_t(a)); }
Napi::Value big(Napi::Env env, const void* p) { return Napi::BigInt::New(env, uint64_t(reinterpret_cast<uintptr_t>(p))); }

// A driver entry point through the runtime (no link against libcuda).
template <typename Fn>
Fn driver_entry(Napi::Env env, const char* symbol) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult status{};
  check(env, cudaGetDriverEntryPointByVersion(symbol, &fn, 12000, cudaEnableDefault, &status), "cudaGetDriverEntryPointByVersion");
  if (status != cudaDriverEntryPointSuccess || fn == nullptr) throw Napi::Error::New(env, std::string("the driver has no ") + symbol);
  return reinterpret_cast<Fn>(fn);
}

Napi::Value ScaleRows(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const uint64_t dst = address(info[0], "dst"), src = address(info[1], "src"), factors = address(info[2], "factors");
  const int64_t rows = integer(info[3], "rows"), hidden = integer(info[4], "hidden");
  const uint64_t stream = address(info[5], "stream");
  const int64_t delay = info.Length() > 6 && !info[6].IsUndefined() ? integer(info[6], "delayNs") : 0;
  check(env, example::scale_rows(ptr<uint16_t>(dst), ptr<const uint16_t>(src), ptr<const float>(factors), rows, hidden, uint64_t(delay),
                                 stream_of(stream)), "scale_rows launch");
  return env.Undefined();
}

// Device memory the application owns: what it hands rankflow with rank.wrapDevice(..., { owner }).
class DeviceBuffer : public Napi::ObjectWrap<DeviceBuffer> {
 public:
  static Napi::Function Define(Napi::Env env) {
    return DefineClass(env, "DeviceBuffer", {InstanceAccessor<&DeviceBuffer::Ptr>("ptr"), InstanceAccessor<&DeviceBuffer::Bytes>("bytes"),
                                             InstanceMethod<&DeviceBuffer::Free>("free")});
  }
  explicit DeviceBuffer(const Napi::CallbackInfo& info) : Napi::ObjectWrap<DeviceBuffer>(info) {
    Napi::Env env = info.Env();
    bytes_ = integer(info[0], "bytes");
    stream_ = stream_of(address(info[1], "stream"));
    check(env, cudaMallocAsync(&ptr_, size_t(bytes_ > 0 ? bytes_ : 1), stream_), "cudaMallocAsync");
  }
  ~DeviceBuffer() override { release(); }

 private:
  Napi::Value Ptr(const Napi::CallbackInfo& info) {
    if (ptr_ == nullptr) throw Napi::Error::New(info.Env(), "this DeviceBuffer was freed");
    return big(info.Env(), ptr_);
  }
  Napi::Value Bytes(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), double(bytes_)); }
  Napi::Value Free(const Napi::CallbackInfo& info) {
    release();
    return info.Env().Undefined();
  }
  // In the order of its stream: after the work queued there that uses it.
  void release() {
    if (ptr_ != nullptr) cudaFreeAsync(ptr_, stream_);
    ptr_ = nullptr;
  }
  void* ptr_ = nullptr;
  int64_t bytes_ = 0;
  cudaStream_t stream_ = nullptr;
};

Napi::Value CreateStream(const Napi::CallbackInfo& info) {
  cudaStream_t s = nullptr;
  check(info.Env(), cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  return big(info.Env(), s);
}
Napi::Value DestroyStream(const Napi::CallbackInfo& info) {
  check(info.Env(), cudaStreamDestroy(stream_of(address(info[0], "stream"))), "cudaStreamDestroy");
  return info.Env().Undefined();
}
Napi::Value SyncStream(const Napi::CallbackInfo& info) {
  check(info.Env(), cudaStreamSynchronize(stream_of(address(info[0], "stream"))), "cudaStreamSynchronize");
  return info.Env().Undefined();
}

Napi::Value CreateEvent(const Napi::CallbackInfo& info) {
  cudaEvent_t e = nullptr;
  check(info.Env(), cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  return big(info.Env(), e);
}
Napi::Value RecordEvent(const Napi::CallbackInfo& info) {
  check(info.Env(), cudaEventRecord(event_of(address(info[0], "event")), stream_of(address(info[1], "stream"))), "cudaEventRecord");
  return info.Env().Undefined();
}
Napi::Value StreamWaitEvent(const Napi::CallbackInfo& info) {
  check(info.Env(), cudaStreamWaitEvent(stream_of(address(info[0], "stream")), event_of(address(info[1], "event")), 0), "cudaStreamWaitEvent");
  return info.Env().Undefined();
}
Napi::Value DestroyEvent(const Napi::CallbackInfo& info) {
  check(info.Env(), cudaEventDestroy(event_of(address(info[0], "event"))), "cudaEventDestroy");
  return info.Env().Undefined();
}

Napi::Value CurrentContext(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  CUcontext c = nullptr;
  const CUresult r = driver_entry<CUresult (*)(CUcontext*)>(env, "cuCtxGetCurrent")(&c);
  if (r != CUDA_SUCCESS) throw Napi::Error::New(env, "cuCtxGetCurrent failed: " + std::to_string(int(r)));
  return big(env, c);
}
Napi::Value StreamContext(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  CUcontext c = nullptr;
  const CUresult r = driver_entry<CUresult (*)(CUstream, CUcontext*)>(env, "cuStreamGetCtx")(
      reinterpret_cast<CUstream>(uintptr_t(address(info[0], "stream"))), &c);
  if (r != CUDA_SUCCESS) throw Napi::Error::New(env, "cuStreamGetCtx failed: " + std::to_string(int(r)));
  return big(env, c);
}

Napi::Object Init(Napi::Env env, Napi::Object exports) {
  exports.Set("scaleRows", Napi::Function::New<ScaleRows>(env));
  exports.Set("DeviceBuffer", DeviceBuffer::Define(env));
  exports.Set("createStream", Napi::Function::New<CreateStream>(env));
  exports.Set("destroyStream", Napi::Function::New<DestroyStream>(env));
  exports.Set("syncStream", Napi::Function::New<SyncStream>(env));
  exports.Set("createEvent", Napi::Function::New<CreateEvent>(env));
  exports.Set("recordEvent", Napi::Function::New<RecordEvent>(env));
  exports.Set("streamWaitEvent", Napi::Function::New<StreamWaitEvent>(env));
  exports.Set("destroyEvent", Napi::Function::New<DestroyEvent>(env));
  exports.Set("currentContext", Napi::Function::New<CurrentContext>(env));
  exports.Set("streamContext", Napi::Function::New<StreamContext>(env));
  return exports;
}

}  // namespace

NODE_API_MODULE(rankflow_interop_example, Init)
