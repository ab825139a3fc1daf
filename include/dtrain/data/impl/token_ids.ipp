// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of token_ids.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <algorithm>
#include <exception>
#include <thread>

#include <dtrain/data/token_ids.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace data {

DTRAIN_INLINE std::span<const std::int64_t> TokenIds::operator[](std::int64_t i) const {
  if (i < 0 || i >= size())
    throw DataError("TokenIds: text " + std::to_string(i) + " is outside [0, " + std::to_string(size()) + ")");
  const auto from = i == 0 ? 0 : ends_[static_cast<std::size_t>(i) - 1];
  return {ids_.data() + from, ends_[static_cast<std::size_t>(i)] - from};
}

DTRAIN_INLINE torch::Tensor TokenIds::tensor(std::int64_t i) const {
  const auto s = (*this)[i];
  return torch::tensor(c10::ArrayRef<std::int64_t>(s.data(), s.size()), torch::kInt64);
}

DTRAIN_INLINE TokenIds TokenIds::select(const std::vector<std::int64_t>& rows) const {
  TokenIds out;
  for (auto r : rows) {
    const auto s = (*this)[r];
    out.ids_.insert(out.ids_.end(), s.begin(), s.end());
    out.end_text();
  }
  return out;
}

namespace detail {

DTRAIN_INLINE std::string_view TokenTable::at(std::int64_t i) const {
  const auto from = i == 0 ? 0 : ends_[static_cast<std::size_t>(i) - 1];
  return {chars_.data() + from, ends_[static_cast<std::size_t>(i)] - from};
}

DTRAIN_INLINE std::int64_t TokenTable::find(std::string_view s) const {
  if (slots_.empty()) return absent;
  const auto h = hash(s);
  for (auto k = h & mask_;; k = (k + 1) & mask_) {
    const auto& slot = slots_[k];
    if (slot.index == 0) return absent;
    if (slot.hash == static_cast<std::uint32_t>(h) && at(slot.index - 1) == s) return slot.index - 1;
  }
}

DTRAIN_INLINE std::int64_t TokenTable::intern(std::string_view s) {
  if ((ends_.size() + 1) * 2 > slots_.size()) grow();
  const auto h = hash(s);
  for (auto k = h & mask_;; k = (k + 1) & mask_) {
    auto& slot = slots_[k];
    if (slot.index == 0) {
      chars_.append(s);
      ends_.push_back(chars_.size());
      slot = {static_cast<std::uint32_t>(h), static_cast<std::uint32_t>(ends_.size())};
      return size() - 1;
    }
    if (slot.hash == static_cast<std::uint32_t>(h) && at(slot.index - 1) == s) return slot.index - 1;
  }
}

DTRAIN_INLINE std::uint64_t TokenTable::hash(std::string_view s) {
  std::uint64_t h = 0x9E3779B97F4A7C15ull ^ s.size();
  std::size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    std::uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
    h ^= h >> 31;
  }
  if (i < s.size()) {
    std::uint64_t w = 0;
    std::memcpy(&w, s.data() + i, s.size() - i);
    h = (h ^ w) * 0x94D049BB133111EBull;
    h ^= h >> 29;
  }
  return h ^ (h >> 32);
}

DTRAIN_INLINE void TokenTable::grow() {
  const auto capacity = slots_.empty() ? std::size_t{64} : slots_.size() * 2;
  if (capacity > (std::size_t{1} << 31)) throw DataError("TokenTable: more than 2^30 distinct strings");
  slots_.assign(capacity, Slot{});
  mask_ = capacity - 1;
  for (std::int64_t i = 0; i < size(); ++i) {
    const auto h = hash(at(i));
    auto k = h & mask_;
    while (slots_[k].index != 0) k = (k + 1) & mask_;
    slots_[k] = {static_cast<std::uint32_t>(h), static_cast<std::uint32_t>(i + 1)};
  }
}

DTRAIN_INLINE void for_ranges_on_threads(std::size_t n, unsigned threads,
                                        const std::function<void(std::size_t, std::size_t)>& run) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  threads = static_cast<unsigned>(std::min<std::size_t>(threads, std::max<std::size_t>(1, n / 256)));
  if (threads <= 1) return run(0, n);
  std::vector<std::thread> pool;
  std::vector<std::exception_ptr> errors(threads);
  const auto per = (n + threads - 1) / threads;
  for (unsigned k = 0; k < threads; ++k)
    pool.emplace_back([&, k] {
      try {
        run(std::min(n, k * per), std::min(n, (k + 1) * per));
      } catch (...) {
        errors[k] = std::current_exception();
      }
    });
  for (auto& t : pool) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace detail
}  // namespace data
DTRAIN_NAMESPACE_END
