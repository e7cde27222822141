// Internals of the scale-out leg shared by rail.cc (listening, frames) and rail_connect.cc (the
// handshake): the wire's constants and little-endian fields, and numeric addresses.
#pragma once

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/random.h>
#include <sys/socket.h>

#include <chrono>
#include <cstring>
#include <string>

#include "hmac.hpp"
#include "runtime/errors.hpp"
#include "runtime/scaleout.hpp"

namespace rankflow::host::wire {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kFrameMagic = 0x31534652;      // "RFS1"
constexpr uint32_t kChallengeMagic = 0x43524652;  // "RFRC"
constexpr uint32_t kAuthMagic = 0x41524652;       // "RFRA"
constexpr uint32_t kProofMagic = 0x50524652;      // "RFRP"
constexpr size_t kHeaderBytes = 40;               // magic, phase, seq, tag, aux, bytes
constexpr size_t kChallengeBytes = 40;            // magic, listener rank, nonce
constexpr size_t kAuthBytes = 76;                 // magic, from, to, nonce, mac
constexpr size_t kProofBytes = 36;                // magic, mac
constexpr size_t kNonceBytes = 32;
constexpr int kMaxPending = 16;                   // accepted connections not authenticated yet
constexpr auto kHandshakeTime = std::chrono::seconds(5);
constexpr auto kPollSlice = std::chrono::milliseconds(10);  // how often a blocked exchange checks its abort words

inline void put32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = uint8_t(v >> (8 * i));
}
inline void put64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = uint8_t(v >> (8 * i));
}
inline uint32_t get32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t(p[i]) << (8 * i);
  return v;
}
inline uint64_t get64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t(p[i]) << (8 * i);
  return v;
}

inline std::string errno_text(int e) { return std::strerror(e); }

// A numeric host and a port as a socket address (no name lookup: the TypeScript layer passes addresses).
inline addrinfo* resolve(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV | AI_PASSIVE;
  addrinfo* ai = nullptr;
  const std::string service = std::to_string(port);
  const int r = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &ai);
  RF_CHECK(r == 0 && ai != nullptr, "EINVAL",
           "scale-out: '" + host + "' is not a numeric IP address (" + std::string(gai_strerror(r)) + ")");
  return ai;
}

inline void random_bytes(uint8_t* p, size_t n) {
  while (n > 0) {
    const ssize_t r = getrandom(p, n, 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      throw sys_error("getrandom");
    }
    p += r, n -= size_t(r);
  }
}

// The MAC of one side of a handshake (see rail.hpp).
inline Digest handshake_mac(const RailKey& key, const char* role, const uint8_t* nonce_l, const uint8_t* nonce_c, int from, int to) {
  uint8_t ranks[8];
  put32(ranks, uint32_t(from));
  put32(ranks + 4, uint32_t(to));
  const std::string label = std::string("rankflow-rail/1 ") + role + "\n";
  const Part parts[] = {{label.data(), label.size()}, {nonce_l, kNonceBytes}, {nonce_c, kNonceBytes}, {ranks, sizeof ranks}};
  return hmac_sha256(key.data(), key.size(), parts, 4);
}

inline void tune(int fd) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
}

}  // namespace rankflow::host::wire
