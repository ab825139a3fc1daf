// SPDX-License-Identifier: Apache-2.0
#pragma once
// Preprocessors fitted on the training split and saved with every checkpoint: LabelEncoder (class
// names <-> ids), StandardScaler (per-feature mean and deviation) and WordVocabulary (a word-level
// tokenizer). Each has fit / transform / save(OutputArchive) / load(InputArchive), so
// `snapshot.with_object("vocab", vocab)` and `ck.load_object("vocab", vocab)` carry it.

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/serialize/archive.h>
#include <torch/types.h>

#include <dtrain/data/token_ids.hpp>
#include <dtrain/error.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace data {

namespace detail {
// A character of a word token: [A-Za-z0-9].
constexpr bool is_ascii_word_char(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}
// A preprocessor's state as JSON text in one archive entry, readable with any JSON tool.
void write_json(torch::serialize::OutputArchive& a, const char* kind, const nlohmann::json& j);
nlohmann::json read_json(torch::serialize::InputArchive& a, const char* kind);
}  // namespace detail

/// Class names <-> ids 0..K-1, the names sorted (so every rank and every run agree).
class LabelEncoder {
 public:
  LabelEncoder() = default;

  /// The distinct names of `labels` (the training split's), sorted.
  template <class Range>
  static LabelEncoder fit(const Range& labels) {
    LabelEncoder e;
    std::map<std::string, int> seen;
    for (const auto& l : labels) seen.emplace(std::string(l), 0);
    for (const auto& [name, unused] : seen) e.classes_.push_back(name);
    e.reindex();
    return e;
  }

  std::int64_t size() const { return static_cast<std::int64_t>(classes_.size()); }
  const std::vector<std::string>& classes() const { return classes_; }
  bool contains(const std::string& name) const { return ids_.count(name) > 0; }

  /// The id of `name`; DataError naming the known classes when it was not seen in fit.
  std::int64_t transform(const std::string& name) const;
  const std::string& inverse(std::int64_t id) const;

  void save(torch::serialize::OutputArchive& a) const { detail::write_json(a, "LabelEncoder", classes_); }
  void load(torch::serialize::InputArchive& a);

 private:
  void reindex();
  std::vector<std::string> classes_;
  std::unordered_map<std::string, std::int64_t> ids_;
};

/// Per-feature standardisation: (x - mean) / std, with the mean and the population standard
/// deviation of the training split (a feature with std 0 is only centred).
class StandardScaler {
 public:
  /// Fits on `x` [N, F] (float).
  static StandardScaler fit(const torch::Tensor& x);
  torch::Tensor transform(const torch::Tensor& x) const;
  torch::Tensor inverse(const torch::Tensor& z) const {
    return (z.to(torch::kFloat64) * std_ + mean_).to(z.scalar_type());
  }
  const torch::Tensor& mean() const { return mean_; }
  const torch::Tensor& stddev() const { return std_; }

  void save(torch::serialize::OutputArchive& a) const;
  void load(torch::serialize::InputArchive& a);

 private:
  torch::Tensor mean_, std_;
};

/// A word-level tokenizer: the text lower-cased, split into runs of [a-z0-9] (Python's
/// re.findall(r"[a-z0-9]+", text.lower())), cut to `max_len` tokens; the vocabulary is the
/// `max_words` most frequent training tokens, ties broken by the word, after <pad> = 0 and <unk> = 1.
/// Exactly the tokenizer of the Python text peer that benchmarks/vs_text_peer.py runs beside
/// examples/text_classifier.
class WordVocabulary : public detail::encodings<WordVocabulary> {
 public:
  static constexpr std::int64_t pad_id = 0, unk_id = 1;

  /// Calls `f(token)` (a std::string_view valid during the call) for each token of `text`, at most
  /// `max_len` of them (0: all): ASCII letters lower-cased, and the two non-ASCII letters whose
  /// Python lower() is ASCII (U+0130 -> "i" and a combining dot, U+212A Kelvin -> "k") likewise.
  /// One buffer for every token: tokenising allocates nothing per token.
  template <class F>
  static void for_each_token(std::string_view text, std::int64_t max_len, F&& f) {
    std::string cur;
    std::int64_t emitted = 0;
    auto flush = [&] {
      if (!cur.empty()) {
        f(std::string_view(cur));
        ++emitted;
      }
      cur.clear();
    };
    for (std::size_t i = 0; i < text.size(); ++i) {
      const auto c = static_cast<unsigned char>(text[i]);
      if (detail::is_ascii_word_char(c)) {  // the whole run of ASCII letters and digits at once
        std::size_t end = i + 1;
        while (end < text.size() && detail::is_ascii_word_char(static_cast<unsigned char>(text[end]))) ++end;
        const auto from = cur.size();
        cur.append(text.data() + i, end - i);
        for (auto k = from; k < cur.size(); ++k)
          if (cur[k] >= 'A' && cur[k] <= 'Z') cur[k] = static_cast<char>(cur[k] - 'A' + 'a');
        i = end - 1;
        continue;
      }
      if (c == 0xC4 && i + 1 < text.size() && static_cast<unsigned char>(text[i + 1]) == 0xB0) {
        cur += 'i';  // "i" + U+0307: the combining dot ends the token
        flush();
        ++i;
      } else if (c == 0xE2 && i + 2 < text.size() && static_cast<unsigned char>(text[i + 1]) == 0x84 &&
                 static_cast<unsigned char>(text[i + 2]) == 0xAA) {
        cur += 'k';
        i += 2;
      } else {
        flush();
      }
      if (max_len > 0 && emitted >= max_len) return;
    }
    flush();
  }

  /// The tokens of `text` (see for_each_token), at most `max_len` (0: all).
  static std::vector<std::string> tokens(std::string_view text, std::int64_t max_len = 0);

  /// The vocabulary of `texts` (the training split's).
  template <class Range>
  static WordVocabulary fit(const Range& texts, std::int64_t max_words, std::int64_t max_len = 0) {
    return fit_transform(texts, max_words, max_len).first;
  }

  /// fit(texts), and the ids of `texts` under it (encode_all(texts)), from one tokenising pass:
  /// each text's tokens are counted and kept as provisional ids, renumbered once ranked.
  template <class Range>
  static std::pair<WordVocabulary, TokenIds> fit_transform(const Range& texts, std::int64_t max_words,
                                                           std::int64_t max_len = 0) {
    if (max_words < 0) throw DataError("WordVocabulary::fit: max_words must be 0 or more");
    detail::TokenTable seen;
    std::vector<std::int64_t> counts;
    TokenIds ids;  // the tokens' indices in `seen` until they are ranked; -1: a text without tokens
    for (const auto& t : texts) {
      bool any = false;
      for_each_token(std::string_view(t), max_len, [&](std::string_view tok) {
        const auto k = seen.intern(tok);
        if (k == static_cast<std::int64_t>(counts.size())) counts.push_back(0);
        ++counts[static_cast<std::size_t>(k)];
        ids.push(k);
        any = true;
      });
      if (!any) ids.push(-1);
      ids.end_text();
    }
    std::vector<std::int64_t> ranked(counts.size());
    for (std::size_t k = 0; k < ranked.size(); ++k) ranked[k] = static_cast<std::int64_t>(k);
    const auto keep = std::min<std::size_t>(ranked.size(), static_cast<std::size_t>(max_words));
    auto by_count = [&](std::int64_t a, std::int64_t b) {
      const auto ca = counts[static_cast<std::size_t>(a)], cb = counts[static_cast<std::size_t>(b)];
      return ca != cb ? ca > cb : seen.at(a) < seen.at(b);
    };
    std::partial_sort(ranked.begin(), ranked.begin() + static_cast<std::ptrdiff_t>(keep), ranked.end(), by_count);
    WordVocabulary v;
    v.max_len_ = max_len;
    std::vector<std::int64_t> final_id(counts.size(), unk_id);
    for (std::size_t r = 0; r < keep; ++r) {
      v.words_.emplace_back(seen.at(ranked[r]));
      final_id[static_cast<std::size_t>(ranked[r])] = static_cast<std::int64_t>(r) + 2;
    }
    v.reindex();
    ids.transform_ids([&](std::int64_t k) { return k < 0 ? unk_id : final_id[static_cast<std::size_t>(k)]; });
    return {std::move(v), std::move(ids)};
  }

  // encode(text): ids of `text`'s tokens (unknown words are <unk>; a text without tokens gives
  // {<unk>}); encode_all(texts); transform(text): from detail::encodings.

  /// Ids in all: the words and the two specials.
  std::int64_t size() const { return static_cast<std::int64_t>(words_.size()) + 2; }
  std::int64_t max_len() const { return max_len_; }
  const std::vector<std::string>& words() const { return words_; }

  void save(torch::serialize::OutputArchive& a) const {
    detail::write_json(a, "WordVocabulary", {{"max_len", max_len_}, {"words", words_}});
  }
  void load(torch::serialize::InputArchive& a);

 private:
  friend class detail::encodings<WordVocabulary>;
  template <class Out>
  void encode_into(std::string_view text, Out&& out) const {
    bool any = false;
    for_each_token(text, max_len_, [&](std::string_view tok) {
      const auto k = ids_.find(tok);
      out(k == detail::TokenTable::absent ? unk_id : k + 2);
      any = true;
    });
    if (!any) out(unk_id);
  }
  void reindex() {
    ids_ = detail::TokenTable();
    for (const auto& w : words_) (void)ids_.intern(w);
  }
  std::vector<std::string> words_;
  detail::TokenTable ids_;  // word i of words_ is id i + 2
  std::int64_t max_len_ = 0;
};

}  // namespace data

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/data/impl/preprocess.ipp>
#endif
