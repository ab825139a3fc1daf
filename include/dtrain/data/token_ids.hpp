// SPDX-License-Identifier: Apache-2.0
#pragma once
// data::TokenIds: the token ids of many texts in one buffer (no vector per text), what a tokenizer's
// fit_transform and encode_all return; and data::detail::TokenTable, the string -> index table
// the tokenizers count and look up words in: open addressing over one character arena, so a
// lookup is a hash and (usually) one probe, with no node or string allocated per word.

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <torch/types.h>

#include <dtrain/error.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace data {

/// Texts' token ids, text after text: `ids[i]` is text i's (a span), `ids.tensor(i)` the same as
/// a 1-D int64 tensor.
class TokenIds {
 public:
  std::int64_t size() const { return static_cast<std::int64_t>(ends_.size()); }
  std::span<const std::int64_t> operator[](std::int64_t i) const {
    if (i < 0 || i >= size())
      throw DataError("TokenIds: text " + std::to_string(i) + " is outside [0, " + std::to_string(size()) + ")");
    const auto from = i == 0 ? 0 : ends_[static_cast<std::size_t>(i) - 1];
    return {ids_.data() + from, ends_[static_cast<std::size_t>(i)] - from};
  }
  torch::Tensor tensor(std::int64_t i) const {
    const auto s = (*this)[i];
    return torch::tensor(c10::ArrayRef<std::int64_t>(s.data(), s.size()), torch::kInt64);
  }
  /// Every text's ids, one after another.
  const std::vector<std::int64_t>& flat() const { return ids_; }

  /// Appends an id to the text being built; end_text() closes it.
  void push(std::int64_t id) { ids_.push_back(id); }
  void end_text() { ends_.push_back(ids_.size()); }
  /// Replaces every id with f(id), in place.
  template <class F>
  void transform_ids(F&& f) {
    for (auto& id : ids_) id = f(id);
  }
  /// The texts `rows` (indices into this), in that order.
  TokenIds select(const std::vector<std::int64_t>& rows) const {
    TokenIds out;
    for (auto r : rows) {
      const auto s = (*this)[r];
      out.ids_.insert(out.ids_.end(), s.begin(), s.end());
      out.end_text();
    }
    return out;
  }
  void reserve(std::size_t texts, std::size_t ids) {
    ends_.reserve(texts);
    ids_.reserve(ids);
  }

 private:
  std::vector<std::int64_t> ids_;
  std::vector<std::size_t> ends_;  // text i's ids end at ends_[i]
};

namespace detail {

/// Strings -> indices 0, 1, ... in insertion order.
class TokenTable {
 public:
  static constexpr std::int64_t absent = -1;

  std::int64_t size() const { return static_cast<std::int64_t>(ends_.size()); }
  std::string_view at(std::int64_t i) const {
    const auto from = i == 0 ? 0 : ends_[static_cast<std::size_t>(i) - 1];
    return {chars_.data() + from, ends_[static_cast<std::size_t>(i)] - from};
  }

  /// The index of `s`, or `absent`.
  std::int64_t find(std::string_view s) const {
    if (slots_.empty()) return absent;
    const auto h = hash(s);
    for (auto k = h & mask_;; k = (k + 1) & mask_) {
      const auto& slot = slots_[k];
      if (slot.index == 0) return absent;
      if (slot.hash == static_cast<std::uint32_t>(h) && at(slot.index - 1) == s) return slot.index - 1;
    }
  }
  /// The index of `s`, adding it when new.
  std::int64_t intern(std::string_view s) {
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

  // 8 bytes at a time, multiply-xorshift mixed: tokens are short, and this is most of a lookup.
  static std::uint64_t hash(std::string_view s) {
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

 private:
  struct Slot {
    std::uint32_t hash = 0, index = 0;  // index: the string's + 1; 0: empty
  };
  void grow() {
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

  std::vector<Slot> slots_;
  std::uint64_t mask_ = 0;
  std::string chars_;              // every string, one after another
  std::vector<std::size_t> ends_;  // string i ends at ends_[i]
};

/// A tokenizer's pad id: its static `pad_id` (WordVocabulary, SentencePieceTokenizer: 0), or its
/// `pad_id()` (WordPieceTokenizer: the pretrained vocabulary's, read from its files).
template <class Tokenizer>
std::int64_t pad_id_of(const Tokenizer& t) {
  if constexpr (requires { t.pad_id(); }) return t.pad_id();
  else return Tokenizer::pad_id;
}

/// What every tokenizer offers on top of its own `encode_into(text, out)`, which calls `out(id)`
/// for each of `text`'s ids: `encode`, `encode_all` and `transform`, written once. A tokenizer
/// derives from it (`class T : public detail::encodings<T>`) and befriends it.
template <class Tokenizer>
class encodings {
 public:
  /// The ids of `text`.
  std::vector<std::int64_t> encode(std::string_view text) const {
    std::vector<std::int64_t> ids;
    self().encode_into(text, [&](std::int64_t id) { ids.push_back(id); });
    return ids;
  }
  /// encode() of each of `texts`, into one buffer.
  template <class Range>
  TokenIds encode_all(const Range& texts) const {
    TokenIds out;
    for (const auto& t : texts) {
      self().encode_into(std::string_view(t), [&](std::int64_t id) { out.push(id); });
      out.end_text();
    }
    return out;
  }
  /// encode(text) as a 1-D int64 tensor.
  torch::Tensor transform(std::string_view text) const { return torch::tensor(encode(text), torch::kInt64); }

 private:
  const Tokenizer& self() const { return static_cast<const Tokenizer&>(*this); }
};

}  // namespace detail

}  // namespace data

DTRAIN_NAMESPACE_END
