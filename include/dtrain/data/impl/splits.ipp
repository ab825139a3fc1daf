// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of splits.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/data/splits.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace data {

DTRAIN_INLINE PythonRandom::PythonRandom(std::uint64_t seed) {
  std::vector<std::uint32_t> key;
  do {
    key.push_back(static_cast<std::uint32_t>(seed & 0xffffffffu));
    seed >>= 32;
  } while (seed);
  init_by_array(key);
}

DTRAIN_INLINE std::uint32_t PythonRandom::next32() {
  if (i_ >= 624) twist();
  std::uint32_t y = mt_[i_++];
  y ^= y >> 11;
  y ^= (y << 7) & 0x9d2c5680u;
  y ^= (y << 15) & 0xefc60000u;
  return y ^ (y >> 18);
}

DTRAIN_INLINE std::uint64_t PythonRandom::below(std::uint64_t n) {
  int k = 0;
  while ((n >> k) != 0) ++k;  // n.bit_length()
  std::uint64_t r = getrandbits(k);
  while (r >= n) r = getrandbits(k);
  return r;
}

DTRAIN_INLINE void PythonRandom::init_genrand(std::uint32_t s) {
  mt_[0] = s;
  for (int i = 1; i < 624; ++i) mt_[i] = 1812433253u * (mt_[i - 1] ^ (mt_[i - 1] >> 30)) + static_cast<std::uint32_t>(i);
  i_ = 624;
}

DTRAIN_INLINE void PythonRandom::init_by_array(const std::vector<std::uint32_t>& key) {
  init_genrand(19650218u);
  std::size_t i = 1, j = 0;
  for (std::size_t k = std::max<std::size_t>(624, key.size()); k; --k) {
    mt_[i] = (mt_[i] ^ ((mt_[i - 1] ^ (mt_[i - 1] >> 30)) * 1664525u)) + key[j] + static_cast<std::uint32_t>(j);
    ++i;
    ++j;
    if (i >= 624) {
      mt_[0] = mt_[623];
      i = 1;
    }
    if (j >= key.size()) j = 0;
  }
  for (std::size_t k = 623; k; --k) {
    mt_[i] = (mt_[i] ^ ((mt_[i - 1] ^ (mt_[i - 1] >> 30)) * 1566083941u)) - static_cast<std::uint32_t>(i);
    if (++i >= 624) {
      mt_[0] = mt_[623];
      i = 1;
    }
  }
  mt_[0] = 0x80000000u;
}

DTRAIN_INLINE void PythonRandom::twist() {
  for (int k = 0; k < 624; ++k) {
    const std::uint32_t y = (mt_[k] & 0x80000000u) | (mt_[(k + 1) % 624] & 0x7fffffffu);
    mt_[k] = mt_[(k + 397) % 624] ^ (y >> 1) ^ ((y & 1u) ? 0x9908b0dfu : 0u);
  }
  i_ = 0;
}

namespace detail {

DTRAIN_INLINE std::int64_t round_half_even(double x) {
  const int mode = std::fegetround();
  std::fesetround(FE_TONEAREST);
  const auto r = static_cast<std::int64_t>(std::nearbyint(x));
  std::fesetround(mode);
  return r;
}

DTRAIN_INLINE void check_fractions(double validation, double test) {
  if (validation < 0 || test < 0 || validation + test > 1)
    throw ConfigError("split fractions must be >= 0 and sum to at most 1, got validation " + std::to_string(validation) +
                      " and test " + std::to_string(test));
}

DTRAIN_INLINE void deal(std::vector<std::int64_t>& group, double validation, double test, std::uint64_t seed, SplitIndices& out) {
  PythonRandom(seed).shuffle(group);
  const auto n = static_cast<std::int64_t>(group.size());
  const auto nv = std::min(n, round_half_even(validation * static_cast<double>(n)));
  const auto nt = std::min(n - nv, round_half_even(test * static_cast<double>(n)));
  out.validation.insert(out.validation.end(), group.begin(), group.begin() + nv);
  out.test.insert(out.test.end(), group.begin() + nv, group.begin() + nv + nt);
  out.train.insert(out.train.end(), group.begin() + nv + nt, group.end());
}
}  // namespace detail

DTRAIN_INLINE SplitIndices random_split(std::int64_t n, double validation, double test, std::uint64_t seed) {
  detail::check_fractions(validation, test);
  std::vector<std::int64_t> all(static_cast<std::size_t>(std::max<std::int64_t>(n, 0)));
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<std::int64_t>(i);
  SplitIndices out;
  detail::deal(all, validation, test, seed, out);
  return out;
}
}  // namespace data
DTRAIN_NAMESPACE_END
