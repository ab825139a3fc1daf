// SPDX-License-Identifier: Apache-2.0
#pragma once
// Seeded train / validation / test splits (random, and stratified by label), and data::Subset,
// a source or dataset restricted to some of its indices. The shuffles are Python's
// random.Random(seed).shuffle, draw for draw, so a split equals the one a Python script (such as
// the text peer that benchmarks/vs_text_peer.py runs) makes with the same seed.

#include <algorithm>
#include <cfenv>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <torch/types.h>

#include <dtrain/data/dataset.hpp>
#include <dtrain/error.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace data {

/// Python's random.Random(seed) for a non-negative integer seed: MT19937 seeded by init_by_array
/// with the seed's 32-bit words, and shuffle() through getrandbits (rejection sampling).
class PythonRandom {
 public:
  explicit PythonRandom(std::uint64_t seed);
  std::uint32_t next32();
  /// random.Random.getrandbits(k), 1 <= k <= 32.
  std::uint32_t getrandbits(int k) { return next32() >> (32 - k); }
  /// random.Random._randbelow(n), n >= 1 (n < 2^32).
  std::uint64_t below(std::uint64_t n);
  /// random.Random.shuffle(x).
  template <class T>
  void shuffle(std::vector<T>& x) {
    for (std::size_t i = x.size(); i-- > 1;) std::swap(x[i], x[static_cast<std::size_t>(below(i + 1))]);
  }

 private:
  void init_genrand(std::uint32_t s);
  void init_by_array(const std::vector<std::uint32_t>& key);
  void twist();
  std::uint32_t mt_[624]{};
  int i_ = 625;
};

/// Indices of a split's three parts.
struct SplitIndices {
  std::vector<std::int64_t> train, validation, test;
};

namespace detail {
// Python's round(): to nearest, halves to even.
std::int64_t round_half_even(double x);
void check_fractions(double validation, double test);
// Takes round(fraction * n) for validation, then for test, from `group` (shuffled); the rest trains.
void deal(std::vector<std::int64_t>& group, double validation, double test, std::uint64_t seed, SplitIndices& out);
}  // namespace detail

/// Samples 0..n-1 shuffled with random.Random(seed): the first round(validation * n) validate, the
/// next round(test * n) test, the rest train (each part in shuffled order).
SplitIndices random_split(std::int64_t n, double validation, double test, std::uint64_t seed);

/// Per label (labels sorted by name), its samples in index order shuffled with a fresh
/// random.Random(seed), the first round(validation * count) to validation, the next
/// round(test * count) to test, the rest to train: every part keeps each label's proportion.
/// benchmarks/peers/text.py's split is stratified_split(tags, 0.2, 0, seed).
/// `labels`: any range of strings or string views (a vector, a CsvTable column).
template <class Labels>
SplitIndices stratified_split(const Labels& labels, double validation, double test, std::uint64_t seed) {
  detail::check_fractions(validation, test);
  std::map<std::string, std::vector<std::int64_t>, std::less<>> by_label;
  std::int64_t i = 0;
  for (const auto& label : labels) {
    const std::string_view name(label);
    auto it = by_label.find(name);
    if (it == by_label.end()) it = by_label.emplace(std::string(name), std::vector<std::int64_t>{}).first;
    it->second.push_back(i++);
  }
  SplitIndices out;
  for (auto& [label, group] : by_label) detail::deal(group, validation, test, seed, out);
  return out;
}

/// `parent` restricted to `indices`: sample i is the parent's sample indices[i]. A row source
/// (row(i)), an indexed source (operator[]) or a RandomAccess dataset (get_batch) stays one.
template <class Parent>
class Subset {
 public:
  Subset(Parent parent, std::vector<std::int64_t> indices)
      : parent_(std::move(parent)), indices_(std::make_shared<const std::vector<std::int64_t>>(std::move(indices))) {
    const auto n = static_cast<std::int64_t>(parent_.size());
    for (auto i : *indices_)
      if (i < 0 || i >= n)
        throw DataError("Subset: index " + std::to_string(i) + " is outside the parent's [0, " + std::to_string(n) + ")");
  }
  std::int64_t size() const { return static_cast<std::int64_t>(indices_->size()); }
  const std::vector<std::int64_t>& indices() const { return *indices_; }
  const Parent& parent() const { return parent_; }

  auto row(std::int64_t i) const requires requires(const Parent& p) { p.row(i); } { return parent_.row(map(i)); }
  auto operator[](std::int64_t i) const requires requires(const Parent& p) { p[i]; } { return parent_[map(i)]; }
  auto get_batch(const torch::Tensor& idx) const requires RandomAccess<Parent> {
    const auto table = torch::from_blob(const_cast<std::int64_t*>(indices_->data()), {size()}, torch::kInt64);
    return parent_.get_batch(table.index_select(0, idx.to(torch::kInt64)));
  }

 private:
  std::int64_t map(std::int64_t i) const {
    if (i < 0 || i >= size())
      throw DataError("Subset: sample " + std::to_string(i) + " is outside [0, " + std::to_string(size()) + ")");
    return (*indices_)[static_cast<std::size_t>(i)];
  }
  Parent parent_;
  std::shared_ptr<const std::vector<std::int64_t>> indices_;
};

}  // namespace data

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/data/impl/splits.ipp>
#endif
