// SPDX-License-Identifier: Apache-2.0
#pragma once
// data::TokenIds: the token ids of many texts in one buffer (no vector per text), what a tokenizer's
// fit_transform and encode_all return; and data::detail::TokenTable, the string -> index table
// the tokenizers count and look up words in: open addressing over one character arena, so a
// lookup is a hash and (usually) one probe, with no node or string allocated per word.

#include <cstdint>
#include <cstring>
#include <functional>
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
  std::span<const std::int64_t> operator[](std::int64_t i) const;
  torch::Tensor tensor(std::int64_t i) const;
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
  TokenIds select(const std::vector<std::int64_t>& rows) const;
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
  std::string_view at(std::int64_t i) const;

  /// The index of `s`, or `absent`.
  std::int64_t find(std::string_view s) const;
  /// The index of `s`, adding it when new.
  std::int64_t intern(std::string_view s);

  // 8 bytes at a time, multiply-xorshift mixed: tokens are short, and this is most of a lookup.
  static std::uint64_t hash(std::string_view s);

 private:
  struct Slot {
    std::uint32_t hash = 0, index = 0;  // index: the string's + 1; 0: empty
  };
  void grow();

  std::vector<Slot> slots_;
  std::uint64_t mask_ = 0;
  std::string chars_;              // every string, one after another
  std::vector<std::size_t> ends_;  // string i ends at ends_[i]
};

/// `run(from, to)` over [0, n) split into contiguous ranges on `threads` threads (0: one a core),
/// fewer when there are few items (below a few hundred texts a thread costs more than it saves);
/// the first exception a range threw is rethrown after every thread joined. The tokenizers'
/// encode_batch.
void for_ranges_on_threads(std::size_t n, unsigned threads, const std::function<void(std::size_t, std::size_t)>& run);

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

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/data/impl/token_ids.ipp>
#endif
