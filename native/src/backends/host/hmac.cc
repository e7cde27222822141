// SHA-256 and HMAC-SHA256 (see hmac.hpp).
#include "hmac.hpp"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <string>

#include "runtime/errors.hpp"

namespace rankflow::host {

namespace {

// The first 32 bits of the fractional parts of the cube roots of the first 64 primes.
constexpr uint32_t kRound[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

inline uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

}  // namespace

Sha256::Sha256() {
  // The first 32 bits of the fractional parts of the square roots of the first 8 primes.
  const uint32_t init[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  std::memcpy(h_, init, sizeof h_);
}

void Sha256::block(const uint8_t* p) {
  uint32_t w[64];
  for (int i = 0; i < 16; ++i)
    w[i] = uint32_t(p[4 * i]) << 24 | uint32_t(p[4 * i + 1]) << 16 | uint32_t(p[4 * i + 2]) << 8 | uint32_t(p[4 * i + 3]);
  for (int i = 16; i < 64; ++i) {
    const uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
    const uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  uint32_t a = h_[0], b = h_[1], c = h_[2], d = h_[3], e = h_[4], f = h_[5], g = h_[6], h = h_[7];
  for (int i = 0; i < 64; ++i) {
    const uint32_t s1 = rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25);
    const uint32_t ch = (e & f) ^ (~e & g);
    const uint32_t t1 = h + s1 + ch + kRound[i] + w[i];
    const uint32_t s0 = rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22);
    const uint32_t maj = (a & b) ^ (a & c) ^ (b & c);
    const uint32_t t2 = s0 + maj;
    h = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
  }
  h_[0] += a, h_[1] += b, h_[2] += c, h_[3] += d, h_[4] += e, h_[5] += f, h_[6] += g, h_[7] += h;
}

void Sha256::update(const uint8_t* data, size_t n) {
  bytes_ += n;
  while (n > 0) {
    const size_t take = std::min(n, sizeof buf_ - fill_);
    std::memcpy(buf_ + fill_, data, take);
    fill_ += take, data += take, n -= take;
    if (fill_ == sizeof buf_) {
      block(buf_);
      fill_ = 0;
    }
  }
}

Digest Sha256::finish() {
  const uint64_t bits = bytes_ * 8;
  const uint8_t one = 0x80, zero = 0;
  update(&one, 1);
  while (fill_ != 56) update(&zero, 1);
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(bits >> (56 - 8 * i));
  update(len, 8);
  Digest out;
  for (int i = 0; i < 8; ++i)
    for (int j = 0; j < 4; ++j) out[size_t(4 * i + j)] = uint8_t(h_[i] >> (24 - 8 * j));
  return out;
}

Digest sha256(const uint8_t* data, size_t n) {
  Sha256 s;
  s.update(data, n);
  return s.finish();
}

Digest hmac_sha256(const uint8_t* key, size_t key_bytes, const Part* parts, size_t num_parts) {
  uint8_t k[64] = {};
  if (key_bytes > sizeof k) {
    const Digest d = sha256(key, key_bytes);
    std::memcpy(k, d.data(), d.size());
  } else if (key_bytes > 0) {
    std::memcpy(k, key, key_bytes);
  }
  uint8_t pad[64];
  for (int i = 0; i < 64; ++i) pad[i] = k[i] ^ 0x36;
  Sha256 inner;
  inner.update(pad, sizeof pad);
  for (size_t i = 0; i < num_parts; ++i) inner.update(static_cast<const uint8_t*>(parts[i].data), parts[i].bytes);
  const Digest ih = inner.finish();
  for (int i = 0; i < 64; ++i) pad[i] = k[i] ^ 0x5c;
  Sha256 outer;
  outer.update(pad, sizeof pad);
  outer.update(ih.data(), ih.size());
  return outer.finish();
}

bool mac_equal(const uint8_t* a, const uint8_t* b) {
  uint8_t diff = 0;
  for (int i = 0; i < 32; ++i) diff |= uint8_t(a[i] ^ b[i]);
  return diff == 0;
}

void hmac_self_test() {
  static std::once_flag once;
  static bool ok = false;
  std::call_once(once, [] {
    // RFC 4231 test case 2, and test case 6 (a key longer than the block).
    const std::string msg2 = "what do ya want for nothing?";
    const Part p2{msg2.data(), msg2.size()};
    const Digest d2 = hmac_sha256(reinterpret_cast<const uint8_t*>("Jefe"), 4, &p2, 1);
    const uint8_t want2[32] = {0x5b, 0xdc, 0xc1, 0x46, 0xbf, 0x60, 0x75, 0x4e, 0x6a, 0x04, 0x24, 0x26, 0x08, 0x95, 0x75, 0xc7,
                               0x5a, 0x00, 0x3f, 0x08, 0x9d, 0x27, 0x39, 0x83, 0x9d, 0xec, 0x58, 0xb9, 0x64, 0xec, 0x38, 0x43};
    uint8_t key6[131];
    std::memset(key6, 0xaa, sizeof key6);
    const std::string msg6 = "Test Using Larger Than Block-Size Key - Hash Key First";
    const Part p6{msg6.data(), msg6.size()};
    const Digest d6 = hmac_sha256(key6, sizeof key6, &p6, 1);
    const uint8_t want6[32] = {0x60, 0xe4, 0x31, 0x59, 0x1e, 0xe0, 0xb6, 0x7f, 0x0d, 0x8a, 0x26, 0xaa, 0xcb, 0xf5, 0xb7, 0x7f,
                               0x8e, 0x0b, 0xc6, 0x21, 0x37, 0x28, 0xc5, 0x14, 0x05, 0x46, 0x04, 0x0f, 0x0e, 0xe3, 0x7f, 0x54};
    ok = mac_equal(d2.data(), want2) && mac_equal(d6.data(), want6);
  });
  RF_CHECK(ok, "BACKEND_UNAVAILABLE", "the addon's HMAC-SHA256 fails RFC 4231's test vectors: this build is broken; rebuild it");
}

}  // namespace rankflow::host
