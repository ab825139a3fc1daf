// SPDX-License-Identifier: Apache-2.0
#pragma once
// data::BpeTokenizer: the byte-level BPE tokenizer of a decoder language model (GPT-2, Llama 3,
// Qwen2; and Llama 2 / Mistral's BPE with byte fallback), read from its tokenizer.json (Hugging
// Face tokenizers' file), with ids equal to tokenizers' (tests/data/check_bpe.py checks every row
// of the text corpus and a set of hard cases on tokenizers trained in the test). The stages of
// tokenizers, each a small piece (detail/bpe_model.hpp): added and special tokens cut out of the
// text first and never split; the normalizer; the pre-tokenizer (GPT-2's or Llama 3's split
// pattern, written out as a scanner over code points, and bytes as GPT-2's printable
// characters); merges applied lowest rank first; the post-processor's special tokens (BOS, EOS),
// truncation and padding. decode() goes back to text. Saved with a checkpoint as its tokenizer.json.

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/serialize/archive.h>
#include <torch/types.h>

#include <dtrain/data/detail/bpe_model.hpp>
#include <dtrain/data/preprocess.hpp>
#include <dtrain/data/token_ids.hpp>
#include <dtrain/error.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace data {

/// One text's ids as tokenizers' Encoding has them, truncated and padded as the tokenizer says.
struct BpeEncoding {
  std::vector<std::int64_t> input_ids, attention_mask;
};

/// A byte-level BPE tokenizer with ids equal to Hugging Face tokenizers' for the same tokenizer.json.
///
///   auto tok = data::BpeTokenizer::from_directory(model_dir);  // tokenizer.json (+ tokenizer_config.json)
///   auto ids = tok.encode("Hello, world!");      // <|begin_of_text|> Hello , world ! (as the file says)
///   auto text = tok.decode(ids);                 // "Hello, world!" (special tokens skipped)
///   auto batch = tok.with_padding(data::BpeTokenizer::Side::left).encode_batch(prompts);
class BpeTokenizer : public detail::encodings<BpeTokenizer> {
 public:
  /// Which end truncation cuts and padding fills.
  enum class Side { left, right };

  BpeTokenizer() = default;

  /// A tokenizer.json. DataError naming the file and what is wrong when it cannot be read or is
  /// not a BPE tokenizer that dtrain reproduces (the unsupported part is named, a split pattern
  /// quoted).
  static BpeTokenizer from_file(const std::filesystem::path& tokenizer_json);
  /// A model directory: its tokenizer.json, and the bos_token, eos_token and pad_token of its
  /// tokenizer_config.json (transformers' file) when it has one.
  static BpeTokenizer from_directory(const std::filesystem::path& dir);
  /// A tokenizer.json already parsed; `origin` names it in messages.
  static BpeTokenizer from_json(nlohmann::json j, const std::string& origin = "tokenizer.json");

  /// tokenizers' encode(text).ids: the post-processor's special tokens around the text
  /// (add_special_tokens), truncated to max_length(), unpadded; what encode_all and transform
  /// give too (detail::encodings). With `add_special_tokens` false, the text's own tokens only
  /// (an added token typed in the text is still that token).
  using detail::encodings<BpeTokenizer>::encode;
  std::vector<std::int64_t> encode(std::string_view text, bool add_special_tokens) const;
  /// tokenizers' encode(text): ids and attention mask, truncated and padded as the tokenizer.json
  /// says (BatchLongest pads one text to itself; Fixed to its length).
  BpeEncoding encoding(std::string_view text, bool add_special_tokens = true) const;
  /// tokenizers' encode_batch: encoding() of each text on `threads` threads (0: one a core),
  /// padded to the batch's longest (BatchLongest) or to the fixed length when padding is on.
  template <class Range>
  std::vector<BpeEncoding> encode_batch(const Range& texts, unsigned threads = 0, bool add_special_tokens = true) const;

  /// tokenizers' decode: the ids' tokens through the tokenizer.json's decoder (ByteLevel: the
  /// bytes back, invalid UTF-8 as U+FFFD); ids outside the vocabulary are dropped, and the
  /// special tokens too when `skip_special_tokens`.
  std::string decode(std::span<const std::int64_t> ids, bool skip_special_tokens = true) const {
    return model().decode(ids, skip_special_tokens);
  }
  /// decode() of a 1-D integer tensor (a generated sequence).
  std::string decode(const torch::Tensor& ids, bool skip_special_tokens = true) const;

  /// The id of a token as the file writes it (an added token's content, or a vocabulary entry
  /// such as "Ġthe"); nullopt when there is none.
  std::optional<std::int64_t> token_to_id(std::string_view token) const { return model().token_to_id(token); }
  /// The token of an id as the file writes it (an added token's content first).
  std::optional<std::string> id_to_token(std::int64_t id) const;
  /// The beginning-of-sequence token's id: tokenizer_config.json's bos_token, else the special
  /// token the post-processor puts before the text (<|begin_of_text|>, <s>), else an added token
  /// named <|begin_of_text|>, <s>, <bos> or <|startoftext|>; nullopt when none (GPT-2's file).
  std::optional<std::int64_t> bos_id() const { return model().bos_id; }
  /// The end-of-sequence token's id, where generation stops: with_eos() or tokenizer_config.json's
  /// eos_token, else the special token the post-processor puts after the text, else the first
  /// added token named </s>, <|endoftext|>, <|end_of_text|>, <eos>, <|eot_id|> or <|im_end|>.
  std::optional<std::int64_t> eos_id() const { return model().eos_id; }
  /// Whether encode() puts a special token before / after the text (the post-processor's).
  bool add_bos() const { return !model().begin_ids.empty(); }
  bool add_eos() const { return !model().end_ids.empty(); }
  /// The pad id: the tokenizer.json's padding pad_id, else tokenizer_config.json's pad_token, else
  /// an added token named <pad>, <|pad|> or [PAD], else eos_id(), else 0.
  std::int64_t pad_id() const { return model().pad_id; }
  /// The vocabulary's size: the largest id + 1 (the model's tokens and the added tokens).
  std::int64_t size() const { return static_cast<std::int64_t>(model().id_tokens.size()); }
  /// Truncation's max_length, special tokens counted (0: none).
  std::int64_t max_length() const { return model().max_length.value_or(0); }

  /// This tokenizer truncating to `n` ids (special tokens counted; 0: no truncation), cutting at
  /// `side`, as tokenizers' enable_truncation(n, direction=side) sets its tokenizer.json.
  BpeTokenizer with_max_length(std::int64_t n, Side side = Side::right) const;
  /// This tokenizer padding a batch to its longest text on `side` with pad_id(), as tokenizers'
  /// enable_padding(direction=side, pad_id=pad_id()); left for a decoder's prompts.
  BpeTokenizer with_padding(Side side) const;
  BpeTokenizer without_padding() const;
  /// This tokenizer with `token` (an added token or a vocabulary entry) as its EOS. Saved with it.
  BpeTokenizer with_eos(std::string_view token) const;

  /// The tokenizer.json this tokenizer is (what save() writes; tokenizers reads it back).
  const nlohmann::json& json() const { return model().source; }

  /// The tokenizer.json, and the special tokens' names taken from tokenizer_config.json or
  /// with_eos() (tokenizers' file has no place for them).
  void save(torch::serialize::OutputArchive& a) const;
  void load(torch::serialize::InputArchive& a);

 private:
  friend class detail::encodings<BpeTokenizer>;
  const detail::BpeModel& model() const {
    if (!model_) throw DataError("BpeTokenizer: used before from_file, from_directory, from_json or load");
    return *model_;
  }
  // names: {"bos_token", "eos_token", "pad_token"} when something other than the file names them.
  static BpeTokenizer build(nlohmann::json j, nlohmann::json names, const std::string& origin);
  template <class Out>
  void encode_into(std::string_view text, Out&& out) const {
    thread_local std::vector<std::int64_t> ids;
    model().encode(text, true, ids);
    for (auto id : ids) out(id);
  }
  BpeEncoding pad(BpeEncoding e, std::int64_t to = 0) const;

  std::shared_ptr<const detail::BpeModel> model_;
  nlohmann::json names_ = nlohmann::json::object();
};

template <class Range>
std::vector<BpeEncoding> BpeTokenizer::encode_batch(const Range& texts, unsigned threads,
                                                    bool add_special_tokens) const {
  const auto& m = model();
  std::vector<std::string_view> views;
  for (const auto& t : texts) views.emplace_back(t);
  std::vector<BpeEncoding> out(views.size());
  detail::for_ranges_on_threads(views.size(), threads, [&](std::size_t from, std::size_t to) {
    for (auto i = from; i < to; ++i) {
      m.encode(views[i], add_special_tokens, out[i].input_ids);
      out[i].attention_mask.assign(out[i].input_ids.size(), 1);
    }
  });
  if (m.padding) {
    std::int64_t longest = 0;
    for (const auto& e : out) longest = std::max(longest, static_cast<std::int64_t>(e.input_ids.size()));
    for (auto& e : out) e = pad(std::move(e), longest);
  }
  return out;
}

}  // namespace data

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/data/impl/bpe_tokenizer.ipp>
#endif
