// SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), for the scale-out leg's handshake (rail.cc): the
// addon links no crypto library (Node's OpenSSL is not exposed to Node-API addons), and these are
// small. Checked once per process against RFC 4231 before first use (hmac_self_test), and by the
// tests against node:crypto on random inputs (addon.hmacSha256).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace rankflow::host {

using Digest = std::array<uint8_t, 32>;

class Sha256 {
 public:
  Sha256();
  void update(const uint8_t* data, size_t n);
  Digest finish();

 private:
  void block(const uint8_t* p);
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t fill_ = 0;
  uint64_t bytes_ = 0;
};

Digest sha256(const uint8_t* data, size_t n);
// HMAC-SHA256 of the concatenation of `parts` (pointer, length pairs) under `key`.
struct Part {
  const void* data;
  size_t bytes;
};
Digest hmac_sha256(const uint8_t* key, size_t key_bytes, const Part* parts, size_t num_parts);
// Constant-time comparison of two 32-byte MACs.
bool mac_equal(const uint8_t* a, const uint8_t* b);
// Throws (BACKEND_UNAVAILABLE) if this build computes RFC 4231's test cases wrongly; runs once.
void hmac_self_test();

}  // namespace rankflow::host
