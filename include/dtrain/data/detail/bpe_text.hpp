// SPDX-License-Identifier: Apache-2.0
#pragma once
// The text side of data::BpeTokenizer, as Hugging Face tokenizers does it: the character classes
// of its regular expressions (bpe_tables.hpp, asked of tokenizers itself by
// scripts/gen-bpe-tables), GPT-2's, Llama 3's and Qwen2's split patterns written out as scanners
// over code points (the fast path), any other pattern through PCRE2 (regex.hpp), GPT-2's byte <->
// printable character map, Rust's String::from_utf8_lossy, tokenizers' NFC and Lowercase.
// Included by dtrain/data/detail/bpe_model.hpp.

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <dtrain/data/detail/bert_text.hpp>
#include <dtrain/data/detail/bpe_tables.hpp>
#include <dtrain/data/detail/regex.hpp>
#include <dtrain/version.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace data::detail::bpe {

enum : std::uint8_t { kLetter = 1, kNumber = 2, kSpace = 4, kWord = 8 };

/// One code point of a text: where it ends, what it is and its classes. A byte that does not
/// begin valid UTF-8 is a character of its own with no class (the patterns treat it as
/// punctuation; byte-level BPE keeps its byte).
struct Char {
  char32_t cp;
  std::uint8_t bytes, bits;
};

/// The classes of `cp` (kLetter | kNumber | kSpace | kWord).
std::uint8_t classes(char32_t cp);

/// The character at s[i] (i < s.size()).
Char char_at(std::string_view s, std::size_t i);

/// The split patterns of GPT-2, Llama 3 and Qwen2, which BpeTokenizer runs by hand-written scanners.
enum class Pattern {
  gpt2,    // kGpt2Pattern
  llama3,  // kLlama3Pattern
  qwen2,   // kQwen2Pattern: Llama 3's with \p{N} (one digit a piece)
};
inline constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
inline constexpr std::string_view kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
inline constexpr std::string_view kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

/// Appends to `out` the [begin, end) byte ranges of `text` that tokenizers' Split(pattern,
/// Isolated) gives: every match of the pattern, in order (the patterns match everywhere, so the
/// pieces cover the text).
void split(Pattern pattern, std::string_view text, std::vector<std::pair<std::uint32_t, std::uint32_t>>& out);

/// A Split(pattern, behavior, invert) step of tokenizers' pre-tokenizer: one of the patterns above
/// by its scanner, any other by PCRE2.
struct Splitter {
  std::optional<Pattern> scanner;
  std::shared_ptr<const Regex> regex;
  /// The pieces that stay, as tokenizers' behaviors give them: Isolated keeps the matches and what
  /// lies between them, Removed what lies between them (inverted: the matches).
  enum Keep { all, matches, gaps } keep = all;
  /// Appends the [begin, end) byte ranges of `text`'s pieces, in order; empty pieces are dropped.
  void pieces(std::string_view text, std::vector<std::pair<std::uint32_t, std::uint32_t>>& out) const;
};

/// Appends tokenizers' Lowercase of `text` (Rust's char::to_lowercase, character by character);
/// bytes that are not UTF-8 are kept.
void lowercase(std::string_view text, std::string& out);

/// GPT-2's bytes_to_unicode: byte b as the printable character that stands for it in byte-level
/// vocabularies (' ' is U+0120 'Ġ', '\n' U+010A 'Ċ'), as UTF-8.
const std::array<std::string, 256>& byte_chars();
/// The byte a byte-level character stands for, or -1.
int char_byte(char32_t c);
/// `token` (a byte-level vocabulary's string) as the bytes it stands for; false when a
/// character of it is not one of byte_chars() (the token cannot come out of byte-level text).
bool token_bytes(std::string_view token, std::string& out);

/// Rust's String::from_utf8_lossy: each maximal invalid subsequence becomes U+FFFD.
std::string utf8_lossy(std::string_view bytes);

/// tokenizers' NFC normalizer (Qwen2's files), into `out`: its canonical decomposition
/// (unicode_tables.hpp), the marks in canonical order, then composed again (kCompositions, Hangul
/// by formula); marks its older Unicode does not know stay where they are. Bytes that are not
/// UTF-8 are kept.
void nfc(std::string_view text, std::string& out);

}  // namespace data::detail::bpe

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/data/detail/impl/bpe_text.ipp>
#endif
