// SPDX-License-Identifier: Apache-2.0
#pragma once
// SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), by hand: the rendezvous store's challenge-response
// needs one hash of a few dozen bytes per connection, and OpenSSL's libcrypto would make every
// program that includes dtrain link one more library (and its package config find it) for that.
// Checked against FIPS 180-4's and RFC 4231's test vectors (tests/unit/store_test.cpp).

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <dtrain/version.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace detail {

using sha256_digest = std::array<std::uint8_t, 32>;

class sha256 {
 public:
  sha256& update(std::string_view data);

  sha256_digest finish();

 private:
  static std::uint32_t rotr(std::uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

  void compress();

  std::uint32_t h_[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                         0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  std::uint8_t block_[64] = {};
  std::size_t used_ = 0;
  std::uint64_t bits_ = 0;
};

inline sha256_digest sha256_of(std::string_view data) { return sha256().update(data).finish(); }

/// HMAC-SHA256 of `message` under `key` (RFC 2104; a key longer than a block is hashed first).
sha256_digest hmac_sha256(std::string_view key, std::string_view message);

/// Whether two digests are equal, in a time that does not depend on where they differ.
bool digests_equal(const sha256_digest& a, const sha256_digest& b);

std::string to_hex(const std::uint8_t* data, std::size_t n);

}  // namespace detail
DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/detail/impl/sha256.ipp>
#endif
