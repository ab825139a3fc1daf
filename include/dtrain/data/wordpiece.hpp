// SPDX-License-Identifier: Apache-2.0
#pragma once
// data::WordPieceTokenizer: the tokenizer of a pretrained BERT-family model, read from its
// tokenizer.json (Hugging Face tokenizers' format) or its vocab.txt, with ids equal to tokenizers'
// (tests/data/check_wordpiece.py checks every row of the text corpus and a set of hard cases).
// The four stages of tokenizers, each a small piece: added tokens ([CLS], [MASK], ... typed in the
// text) cut out first; BertNormalizer and BertPreTokenizer (detail/bert_text.hpp); WordPiece,
// greedy longest match first with "##" continuations; the post-processor's template
// ([CLS] A [SEP] B [SEP]), truncation and padding. Saved with the checkpoint like WordVocabulary,
// as its tokenizer.json.

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/serialize/archive.h>
#include <torch/types.h>

#include <dtrain/data/detail/bert_text.hpp>
#include <dtrain/data/preprocess.hpp>
#include <dtrain/data/token_ids.hpp>
#include <dtrain/error.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace data {

/// One text's (or pair's) ids as tokenizers' Encoding has them, padded as the tokenizer says.
struct WordPieceEncoding {
  std::vector<std::int64_t> input_ids, attention_mask, token_type_ids;
};

namespace detail {

// What a tokenizer.json says, checked and resolved once; the tokenizer keeps it behind a
// shared_ptr, so copies are cheap and encoding needs no lock.
struct WordPieceModel {
  nlohmann::json source;  // the tokenizer.json, as it is saved with a checkpoint
  std::string origin;     // the file it came from, for messages
  BertNormalizer normalizer;
  bool normalize = false, pre_tokenize = false;
  TokenTable starts, continuations;           // pieces, and "##" pieces without the prefix
  std::vector<std::int64_t> start_ids, continuation_ids;
  std::size_t longest_start = 0, longest_continuation = 0;  // bytes
  std::int64_t unk_id = 0, vocab_size = 0, max_input_chars_per_word = 100;
  struct Added {
    std::string content;
    std::int64_t id;
  };
  std::vector<Added> added;        // longest first, so the first match is the longest
  bool added_first_byte[256] = {};
  struct Piece {
    bool sequence;  // A or B (true), or special ids
    int which;      // 0 = A, 1 = B
    std::vector<std::int64_t> ids;
    std::int64_t type_id;
  };
  std::vector<Piece> single, pair;
  std::optional<std::int64_t> max_length;  // truncation, counting the special tokens
  std::string truncation_strategy = "LongestFirst";
  bool truncate_left = false, pad_left = false;
  std::optional<std::int64_t> pad_fixed;  // padding: Fixed(n); else BatchLongest when `padding`
  bool padding = false;
  std::int64_t pad_id = 0, pad_type_id = 0, pad_to_multiple_of = 0;

  [[noreturn]] void fail(const std::string& what) const {
    throw DataError("WordPieceTokenizer: " + origin + ": " + what);
  }

  template <class Out>
  void word_pieces(std::string_view w, std::size_t chars, Out&& out) const {
    if (static_cast<std::int64_t>(chars) > max_input_chars_per_word) return out(unk_id);
    if (auto k = starts.find(w); k != TokenTable::absent) return out(start_ids[static_cast<std::size_t>(k)]);
    thread_local std::vector<std::int64_t> ids;
    ids.clear();
    std::size_t start = 0;
    while (start < w.size()) {
      const auto& table = start == 0 ? starts : continuations;
      auto end = std::min(w.size(), start + (start == 0 ? longest_start : longest_continuation));
      std::int64_t found = TokenTable::absent;
      for (; end > start; --end) {
        if (end < w.size() && (static_cast<unsigned char>(w[end]) & 0xC0) == 0x80) continue;  // mid-character
        if ((found = table.find(w.substr(start, end - start))) != TokenTable::absent) break;
      }
      if (found == TokenTable::absent) return out(unk_id);  // no piece fits: the whole word is [UNK]
      ids.push_back(start == 0 ? start_ids[static_cast<std::size_t>(found)]
                               : continuation_ids[static_cast<std::size_t>(found)]);
      start = end;
    }
    for (auto id : ids) out(id);
  }

  // Normalized, pre-tokenized, WordPiece'd `text` (a part without added tokens).
  template <class Out>
  void model_ids(std::string_view text, Out&& out) const {
    thread_local std::vector<char32_t> s;
    thread_local std::string w;
    if (normalize) {
      normalizer(text, s);
    } else {
      s.clear();
      for (std::size_t i = 0; i < text.size();) s.push_back(unicode::next_utf8(text, i));
    }
    const auto piece = [&](std::size_t from, std::size_t to) {
      w.clear();
      for (auto i = from; i < to; ++i) unicode::put_utf8(s[i], w);
      word_pieces(w, to - from, out);
    };
    if (pre_tokenize) bert_words(s, piece);
    else if (!s.empty()) piece(0, s.size());
  }

  /// Every id of `text` before the post-processor: added tokens as they are typed, the rest modelled.
  template <class Out>
  void sequence_ids(std::string_view text, Out&& out) const {
    std::size_t from = 0;
    for (std::size_t i = 0; i < text.size(); ++i) {
      if (!added_first_byte[static_cast<unsigned char>(text[i])]) continue;
      for (const auto& a : added)
        if (text.compare(i, a.content.size(), a.content) == 0) {
          if (i > from) model_ids(text.substr(from, i - from), out);
          out(a.id);
          from = i + a.content.size();
          i = from - 1;
          break;
        }
    }
    if (from < text.size()) model_ids(text.substr(from), out);
  }
};

}  // namespace detail

/// A BERT WordPiece tokenizer with ids equal to Hugging Face tokenizers' for the same tokenizer.json.
///
///   auto tok = data::WordPieceTokenizer::from_file(dir / "tokenizer.json");
///   auto ids = tok.encode("Hello, world!");        // [CLS] hello , world ! [SEP], truncated
///   auto e = tok.encoding("a question", "a passage"); // ids, attention mask, token type ids, padded
class WordPieceTokenizer : public detail::encodings<WordPieceTokenizer> {
 public:
  /// vocab.txt's companions: what a tokenizer.json would say (BertTokenizerFast's defaults).
  struct Options {
    bool lowercase = true;                    // do_lower_case
    std::optional<bool> strip_accents;        // null: as lowercase
    bool clean_text = true, handle_chinese_chars = true;
    std::int64_t max_length = 512;            // truncation, counting [CLS] and [SEP] (0: none)
    std::string unk_token = "[UNK]", cls_token = "[CLS]", sep_token = "[SEP]", pad_token = "[PAD]",
                mask_token = "[MASK]";
    std::string continuing_subword_prefix = "##";
    std::int64_t max_input_chars_per_word = 100;
  };

  WordPieceTokenizer() = default;

  /// A tokenizer.json (Hugging Face tokenizers' file). DataError naming the file and what is wrong
  /// when it cannot be read or is not a WordPiece tokenizer that dtrain reproduces.
  static WordPieceTokenizer from_file(const std::filesystem::path& tokenizer_json) {
    return from_json(parse_file(tokenizer_json), tokenizer_json.string());
  }
  /// A model directory: its tokenizer.json, else its vocab.txt with `options`.
  static WordPieceTokenizer from_directory(const std::filesystem::path& dir) { return from_directory(dir, Options{}); }
  static WordPieceTokenizer from_directory(const std::filesystem::path& dir, const Options& options);
  /// A vocab.txt (one piece a line, the line number its id) and the options, as BertTokenizerFast
  /// converts them to a tokenizer.json.
  static WordPieceTokenizer from_vocab(const std::filesystem::path& vocab_txt) { return from_vocab(vocab_txt, Options{}); }
  static WordPieceTokenizer from_vocab(const std::filesystem::path& vocab_txt, const Options& o);
  /// A tokenizer.json already parsed; `origin` names it in messages.
  static WordPieceTokenizer from_json(nlohmann::json j, const std::string& origin = "tokenizer.json");

  /// [CLS] text [SEP] (the post-processor's single template), truncated to max_length(); what
  /// encode, encode_all and transform give (from detail::encodings), unpadded: pad_to_longest pads.
  // encode(text), encode_all(texts), transform(text): from detail::encodings.

  /// tokenizers' Tokenizer.encode(text) / encode(a, b): ids, attention mask and token type ids,
  /// truncated and padded as the tokenizer.json says (BatchLongest pads one text to itself).
  WordPieceEncoding encoding(std::string_view text) const { return pad(encoded(text, nullptr)); }
  WordPieceEncoding encoding(std::string_view a, std::string_view b) const { return pad(encoded(a, &b)); }
  /// tokenizers' encode_batch: encoding() of each text, on `threads` threads (0: one a core),
  /// padded to the longest in the batch (BatchLongest) or to the fixed length.
  template <class Range>
  std::vector<WordPieceEncoding> encode_batch(const Range& texts, unsigned threads = 0) const;

  /// The pad id: the tokenizer.json's padding pad_id, else [PAD]'s (0 when it has neither).
  std::int64_t pad_id() const { return model().pad_id; }
  std::int64_t unk_id() const { return model().unk_id; }
  /// The vocabulary's size (pieces and added tokens: the largest id + 1).
  std::int64_t size() const { return model().vocab_size; }
  /// Truncation's max_length (0: none).
  std::int64_t max_length() const { return model().max_length.value_or(0); }
  /// This tokenizer truncating to `n` tokens, [CLS] and [SEP] counted (0: no truncation), as
  /// tokenizers' enable_truncation(max_length=n) (disable_truncation()) sets its tokenizer.json;
  /// a model's tokenizer.json often says 128 or 512.
  WordPieceTokenizer with_max_length(std::int64_t n) const;
  /// The tokenizer.json this tokenizer is (what save() writes; tokenizers reads it back).
  const nlohmann::json& json() const { return model().source; }

  void save(torch::serialize::OutputArchive& a) const { detail::write_json(a, "WordPieceTokenizer", json()); }
  void load(torch::serialize::InputArchive& a) {
    *this = from_json(detail::read_json(a, "WordPieceTokenizer"), "the checkpoint's WordPieceTokenizer");
  }

 private:
  friend class detail::encodings<WordPieceTokenizer>;
  const detail::WordPieceModel& model() const {
    if (!model_) throw DataError("WordPieceTokenizer: used before from_file, from_vocab or load");
    return *model_;
  }
  static nlohmann::json parse_file(const std::filesystem::path& path);
  template <class Out>
  void encode_into(std::string_view text, Out&& out) const {
    const auto e = encoded(text, nullptr);
    for (auto id : e.input_ids) out(id);
  }
  WordPieceEncoding encoded(std::string_view a, const std::string_view* b) const;
  WordPieceEncoding pad(WordPieceEncoding e, std::int64_t to = 0) const;

  std::shared_ptr<const detail::WordPieceModel> model_;
};

}  // namespace data

DTRAIN_NAMESPACE_END

#include <dtrain/data/detail/wordpiece_impl.hpp>

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/data/impl/wordpiece.ipp>
#endif
