// The one error type of the native core. `code` is one of rankflow's public error codes
// (EINVAL, TIMEOUT_CPU, TIMEOUT_GPU, RANK_FAILED, BACKEND_UNAVAILABLE, STATE); the TypeScript layer
// turns it into a RankflowError with the same code, rank and message.
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>

namespace rankflow {

struct Error : std::runtime_error {
  std::string code;
  int rank;      // the rank the error is about (the failed peer, the waiting rank), -1 if none
  std::string phase;
  Error(std::string code, const std::string& message, int rank = -1, std::string phase = {})
      : std::runtime_error(message), code(std::move(code)), rank(rank), phase(std::move(phase)) {}
};

// Host checks with the condition and a message that says what to do (DeepEP's EP_HOST_ASSERT).
#define RF_CHECK(cond, code, msg)                                        \
  do {                                                                   \
    if (!(cond)) throw ::rankflow::Error((code), std::string(msg));      \
  } while (0)

// Seconds as people write them in messages: "1", "2.5", "300" (not "1.000000").
inline std::string seconds_text(double s) {
  char b[32];
  snprintf(b, sizeof b, "%g", s);
  return b;
}

// A 64-bit word in messages: counter values as all 16 hex digits ("0x000000000000002a"), addresses
// and handles without leading zeros (padded = false: "0x7f3a00000000").
inline std::string hex_text(uint64_t v, bool padded = true) {
  char b[32];
  snprintf(b, sizeof b, padded ? "0x%016llx" : "0x%llx", static_cast<unsigned long long>(v));
  return b;
}

inline Error sys_error(const std::string& call) {
  return Error("EINVAL", call + " failed: " + std::strerror(errno));
}

}  // namespace rankflow
