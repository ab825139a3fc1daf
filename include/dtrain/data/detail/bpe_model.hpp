// SPDX-License-Identifier: Apache-2.0
#pragma once
// What data::BpeTokenizer reads from a tokenizer.json, resolved once into tables (vocabulary,
// merges by rank, added tokens, the stages before and after the model), and the four stages of
// Hugging Face tokenizers run over them: added tokens cut out, normalizer, pre-tokenizer, BPE
// model; then the post-processor's special tokens, truncation; and decoding back to text.
// Included by dtrain/data/bpe_tokenizer.hpp.

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <dtrain/data/detail/bpe_text.hpp>
#include <dtrain/data/token_ids.hpp>
#include <dtrain/error.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace data::detail {

/// (left id, right id) -> (rank, merged id), open addressing: a lookup is a multiply and
/// (usually) one probe. A pair given twice keeps its last rank, as tokenizers' map does.
class MergeTable {
 public:
  void put(std::uint32_t left, std::uint32_t right, std::uint32_t rank, std::uint32_t id);
  /// (rank << 32 | merged id) of the pair, or kNone.
  static constexpr std::uint64_t kNone = ~std::uint64_t{0};
  std::uint64_t find(std::uint32_t left, std::uint32_t right) const {
    if (slots_.empty()) return kNone;
    const auto key = (std::uint64_t{left} << 32) | right;
    for (auto i = slot_of(key);; i = (i + 1) & mask_) {
      const auto& s = slots_[i];
      if (s.key == key) return s.value;
      if (s.key == kEmpty) return kNone;
    }
  }
  std::size_t size() const { return size_; }

 private:
  static constexpr std::uint64_t kEmpty = ~std::uint64_t{0};  // ids are below 2^31: no pair is this
  struct Slot {
    std::uint64_t key = kEmpty, value = kNone;
  };
  std::size_t slot_of(std::uint64_t key) const {
    return static_cast<std::size_t>(((key ^ (key >> 29)) * 0x9E3779B97F4A7C15ull) >> shift_) & mask_;
  }
  void grow();
  std::vector<Slot> slots_;
  std::size_t mask_ = 0, size_ = 0;
  int shift_ = 64;
};

/// The added tokens' patterns, as a byte trie: the longest pattern at a position.
class AddedTrie {
 public:
  void add(std::string_view pattern, std::uint32_t token);
  bool empty() const { return nodes_.size() == 1; }
  bool may_start(unsigned char c) const { return first_[c]; }
  /// The longest pattern that text[i...] starts with: (token, bytes), bytes 0 when none.
  std::pair<std::uint32_t, std::size_t> longest(std::string_view text, std::size_t i) const;

 private:
  struct Node {
    std::vector<std::pair<unsigned char, std::uint32_t>> next;  // sorted by byte
    std::int64_t token = -1;
  };
  std::vector<Node> nodes_ = std::vector<Node>(1);
  bool first_[256] = {};
};

struct BpeModel {
  nlohmann::json source;                 // the tokenizer.json, as it is saved with a checkpoint
  std::string origin;                    // the file it came from, for messages
  std::uint64_t serial = next_serial();  // which model a thread's word cache holds words of
  [[noreturn]] void fail(const std::string& what) const { throw DataError("BpeTokenizer: " + origin + ": " + what); }

  // --- The BPE model -----------------------------------------------------------------------------
  // Words are bytes when the pre-tokenizer ends in ByteLevel (each byte stands for its printable
  // character of bpe::byte_chars(), and the vocabulary's tokens are kept as the bytes they stand
  // for), UTF-8 otherwise.
  bool byte_level = false;
  TokenTable vocab;                      // the model's tokens as words spell them
  std::vector<std::uint32_t> vocab_ids;  // by index of `vocab`
  TokenTable unspelled;                  // byte-level: tokens no word spells (<unk>), as written
  std::vector<std::uint32_t> unspelled_ids;
  std::vector<std::string> id_tokens;  // id -> token as the file writes it (model, then added)
  std::vector<std::uint8_t> id_known;  // id -> 1 model token, 2 added token, 0 none
  MergeTable merges;
  std::string prefix, suffix;  // continuing_subword_prefix, end_of_word_suffix (as words spell them)
  std::optional<std::string> unk_token;
  std::optional<std::uint32_t> unk_id;  // unk_token's id, when the vocabulary has it
  bool fuse_unk = false, byte_fallback = false, ignore_merges = false;
  std::array<std::int64_t, 256> byte_fallback_ids{};  // <0xXX>'s id, or -1
  // Byte-level words: the id of byte b as a word's first, middle, last or only unit (the prefix
  // and suffix applied), or -1 when the vocabulary lacks it.
  std::array<std::array<std::int64_t, 256>, 4> unit_ids{};

  // --- Added tokens, cut out of the text before anything else ------------------------------------
  struct Added {
    std::string content, decoded;  // decoded: what decode() gives (normalized when `normalized`)
    std::uint32_t id;
    bool special, normalized, single_word, lstrip, rstrip;
  };
  std::vector<Added> added;
  AddedTrie raw_trie, normalized_trie;  // normalized = false (matched in the raw text) and true
  TokenTable special_contents;          // decode's skip_special_tokens compares the token's text

  // --- Normalizer, pre-tokenizer, post-processor, decoder ------------------------------------
  struct Normalize {
    enum Kind { prepend, replace, nfc, lowercase } kind;
    std::string text, by;                // prepend `text`; replace `text` (or `pattern`'s matches) by `by`
    std::shared_ptr<const Regex> pattern;  // Replace of a Regex
  };
  std::vector<Normalize> normalizers;
  std::vector<bpe::Splitter> splits;  // the Split steps, in order
  bool byte_level_step = false, add_prefix_space = false, byte_level_regex = false;
  struct Metaspace {
    std::string replacement;
    enum Prepend { always, first, never } prepend;
    bool split;
  };
  std::optional<Metaspace> metaspace;
  std::vector<std::uint32_t> begin_ids, end_ids;  // what the post-processor puts around a text
  struct Decode {
    enum Kind { byte_level, metaspace, replace, byte_fallback, fuse, strip } kind;
    std::string text, by;  // replace `text` by `by`; strip `text` (one character); metaspace's replacement
    std::size_t start = 0, stop = 0;
    bool prepend = true;  // metaspace: drop the first token's leading replacement
  };
  std::optional<std::vector<Decode>> decoders;  // none: tokens joined with spaces

  // --- Truncation and padding ----------------------------------------------------------------
  std::optional<std::int64_t> max_length;
  bool truncate_left = false, padding = false, pad_left = false;
  std::optional<std::int64_t> pad_fixed;
  std::int64_t pad_id = 0, pad_to_multiple_of = 0;
  std::optional<std::int64_t> bos_id, eos_id;

  /// `text`'s ids: added tokens as typed, the rest through the stages; with the post-processor's
  /// special tokens when `special`; truncated; unpadded. Into `ids` (cleared first).
  void encode(std::string_view text, bool special, std::vector<std::int64_t>& ids) const;
  /// tokenizers' decode: ids to tokens (unknown ids dropped; special tokens too when `skip_special`),
  /// then the decoder.
  std::string decode(std::span<const std::int64_t> ids, bool skip_special) const;
  /// The id of a token as the file writes it (an added token's content first).
  std::optional<std::int64_t> token_to_id(std::string_view token) const;
  /// The id of a model token as the file writes it.
  std::optional<std::uint32_t> model_id(std::string_view token) const;
  /// `text` through the normalizers, into `out`.
  void normalize(std::string_view text, std::string& out) const;
  /// The BPE model on one pre-tokenized word.
  void word(std::string_view w, std::vector<std::int64_t>& ids) const;

 private:
  void segment(std::string_view text, bool at_origin, std::vector<std::int64_t>& ids) const;
  void pre_tokenized(std::string_view text, bool at_origin, std::vector<std::int64_t>& ids) const;
  void split_from(std::size_t step, std::string_view text, std::vector<std::int64_t>& ids) const;
  void byte_level_word(std::string_view piece, std::vector<std::int64_t>& ids) const;
  void unknown_unit(std::string_view key, std::vector<std::uint32_t>& symbols, std::optional<std::uint32_t>& unk) const;
  void merge(std::vector<std::uint32_t>& symbols) const;
  static std::uint64_t next_serial();
};

/// A thread's words already through the BPE model, as tokenizers keeps them (its BPE cache): most
/// words of a text have been seen before. Words of one model at a time; cleared when full.
struct BpeWordCache {
  static constexpr std::size_t kMaxWords = 1 << 16, kMaxBytes = 256;  // tokenizers: words below 256 bytes
  std::uint64_t serial = 0;
  TokenTable words;
  std::vector<std::uint32_t> ends;  // word k's ids are ids[ends[k - 1], ends[k])
  std::vector<std::uint32_t> ids;
  static BpeWordCache& of(const BpeModel& m);
};

}  // namespace data::detail

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/data/detail/impl/bpe_model.ipp>
#endif
