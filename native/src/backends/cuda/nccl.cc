// Finding and loading libnccl.so.2, checking its version, naming its errors.
#include "nccl.hpp"

#include <dlfcn.h>
#include <glob.h>
#include <link.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <vector>

namespace rankflow::cuda {
namespace {

struct Candidate {
  std::string path;
  std::string origin;
};

NcclSearch& search() {
  static NcclSearch s;
  return s;
}

// The python package's library directory, asked of python3 itself (it knows its site-packages),
// then guessed from the usual install prefixes when python3 is absent or the import fails.
std::vector<std::string> python_nccl_dirs() {
  std::vector<std::string> dirs;
  if (FILE* p = popen("python3 -c 'import nvidia.nccl,os;print(os.path.dirname(nvidia.nccl.__file__ or "
                      "list(nvidia.nccl.__path__)[0]))' 2>/dev/null",
                      "r")) {
    char line[4096] = {};
    if (fgets(line, sizeof(line), p) != nullptr) {
      std::string dir(line);
      while (!dir.empty() && (dir.back() == '\n' || dir.back() == '\r')) dir.pop_back();
      if (!dir.empty()) dirs.push_back(dir + "/lib");
    }
    pclose(p);
  }
  std::vector<std::string> patterns = {"/usr/local/lib/python3*/dist-packages/nvidia/nccl/lib",
                                       "/usr/local/lib/python3*/site-packages/nvidia/nccl/lib",
                                       "/usr/lib/python3*/dist-packages/nvidia/nccl/lib",
                                       "/usr/lib/python3/dist-packages/nvidia/nccl/lib"};
  for (const std::string& prefix : search().python_prefixes)
    patterns.push_back(prefix + "/lib/python3*/site-packages/nvidia/nccl/lib");
  for (const std::string& pattern : patterns) {
    glob_t g = {};
    if (glob(pattern.c_str(), 0, nullptr, &g) == 0)
      for (size_t i = 0; i < g.gl_pathc; ++i) dirs.emplace_back(g.gl_pathv[i]);
    globfree(&g);
  }
  return dirs;
}

std::vector<Candidate> candidates() {
  std::vector<Candidate> out;
  if (!search().home.empty()) out.push_back({search().home + "/lib/libnccl.so.2", "NCCL_HOME"});
  out.push_back({"libnccl.so.2", "system"});
  for (const std::string& dir : python_nccl_dirs()) out.push_back({dir + "/libnccl.so.2", "python package"});
  return out;
}

struct Loaded {
  Nccl table;
  std::string error;
};

template <typename F>
bool lookup(void* handle, F& fn, const char* name, std::string& missing) {
  fn = reinterpret_cast<F>(dlsym(handle, name));
  if (fn == nullptr) missing += std::string(missing.empty() ? "" : ", ") + name;
  return fn != nullptr;
}

void load(Loaded& out) {
  std::string seen;  // one line per candidate tried, for the error
  for (const Candidate& c : candidates()) {
    void* handle = dlopen(c.path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* e = dlerror();
      seen += "\n  " + c.path + " (" + c.origin + "): " + (e != nullptr ? e : "not found");
      continue;
    }
    Nccl t;
    link_map* map = nullptr;
    t.library = dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name[0] != '\0'
                    ? map->l_name
                    : c.path;
    t.origin = c.origin;
    std::string missing;
    lookup(handle, t.ncclGetVersion, "ncclGetVersion", missing);
    if (t.ncclGetVersion == nullptr || t.ncclGetVersion(&t.version) != ncclSuccess) {
      seen += "\n  " + t.library + " (" + c.origin + "): not a usable NCCL (ncclGetVersion failed)";
      dlclose(handle);
      continue;
    }
    if (t.version < kNcclMinVersion) {
      seen += "\n  " + t.library + " (" + c.origin + "): NCCL " + nccl_version_string(t.version) +
              ", older than 2.28";
      dlclose(handle);
      continue;
    }
    lookup(handle, t.ncclGetUniqueId, "ncclGetUniqueId", missing);
    lookup(handle, t.ncclCommInitRank, "ncclCommInitRank", missing);
    lookup(handle, t.ncclCommDestroy, "ncclCommDestroy", missing);
    lookup(handle, t.ncclCommAbort, "ncclCommAbort", missing);
    lookup(handle, t.ncclCommGetAsyncError, "ncclCommGetAsyncError", missing);
    lookup(handle, t.ncclCommWindowRegister, "ncclCommWindowRegister", missing);
    lookup(handle, t.ncclCommWindowDeregister, "ncclCommWindowDeregister", missing);
    lookup(handle, t.ncclAllGather, "ncclAllGather", missing);
    lookup(handle, t.ncclAlltoAll, "ncclAlltoAll", missing);
    lookup(handle, t.ncclGroupStart, "ncclGroupStart", missing);
    lookup(handle, t.ncclGroupEnd, "ncclGroupEnd", missing);
    lookup(handle, t.ncclGetErrorString, "ncclGetErrorString", missing);
    lookup(handle, t.ncclGetLastError, "ncclGetLastError", missing);
    t.comm_shrink = dlsym(handle, "ncclCommShrink") != nullptr;  // optional: reported by doctor only
    t.comm_grow = dlsym(handle, "ncclCommGrow") != nullptr;
    if (!missing.empty()) {
      seen += "\n  " + t.library + " (" + c.origin + "): NCCL " + nccl_version_string(t.version) +
              " lacks " + missing;
      dlclose(handle);
      continue;
    }
    out.table = t;  // the handle stays open for the life of the process
    return;
  }
  out.error = "no usable NCCL >= 2.28 was found (tried:" + seen +
              "). Install it (pip install nvidia-nccl-cu13) or point NCCL_HOME at a directory whose "
              "lib/ holds libnccl.so.2 of version 2.28 or newer.";
}

const Loaded& loaded() {
  static Loaded state;
  static std::once_flag once;
  std::call_once(once, [] { load(state); });
  return state;
}

const char* result_name(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "ncclSuccess";
    case ncclUnhandledCudaError: return "ncclUnhandledCudaError";
    case ncclSystemError: return "ncclSystemError";
    case ncclInternalError: return "ncclInternalError";
    case ncclInvalidArgument: return "ncclInvalidArgument";
    case ncclInvalidUsage: return "ncclInvalidUsage";
    case ncclRemoteError: return "ncclRemoteError";
    case ncclInProgress: return "ncclInProgress";
  }
  return "ncclError";
}

}  // namespace

const Nccl& nccl() {
  const Loaded& l = loaded();
  if (!l.error.empty()) throw CudaError("BACKEND_UNAVAILABLE", "", l.error);
  return l.table;
}

void set_nccl_search(const NcclSearch& s) {
  static std::once_flag once;
  std::call_once(once, [&] { search() = s; });
}

bool nccl_available(std::string* why) {
  const Loaded& l = loaded();
  if (why != nullptr) *why = l.error;
  return l.error.empty();
}

void set_nccl_host_id(const std::string& id) {
  if (id.empty()) return;
  // Ranks of one process call this from their own threads: one at a time (setenv is not reentrant
  // with itself everywhere), and never overwriting (the first value is the one NCCL will have read).
  static std::mutex m;
  std::lock_guard<std::mutex> lock(m);
  setenv("NCCL_HOSTID", id.c_str(), 0);
}

std::string nccl_version_string(int code) {
  return std::to_string(code / 10000) + "." + std::to_string(code % 10000 / 100) + "." +
         std::to_string(code % 100);
}

void nccl_check(ncclResult_t r, const char* call, ncclComm_t comm) {
  if (r == ncclSuccess) return;
  const Nccl& n = nccl();
  const char* text = n.ncclGetErrorString(r);
  const char* last = n.ncclGetLastError(comm);
  std::string message = std::string(call) + " failed: " + result_name(r) + ": " +
                        (text != nullptr ? text : "no description");
  if (last != nullptr && last[0] != '\0') message += " (" + std::string(last) + ")";
  message += ". Run with NCCL_DEBUG=WARN for NCCL's own account.";
  throw CudaError(result_name(r), call, message);
}

}  // namespace rankflow::cuda
