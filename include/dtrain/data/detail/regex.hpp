// SPDX-License-Identifier: Apache-2.0
#pragma once
// The regular expressions of a tokenizer.json that BpeTokenizer has no hand-written scanner for
// (a Split pre-tokenizer's pattern other than GPT-2's, Llama 3's and Qwen2's; a Replace
// normalizer's), run by PCRE2: Debian's libpcre2-8-0, which every Debian system has (grep needs
// it). It is opened with dlopen when the first such pattern is compiled, so programs that never
// meet one do not depend on it.
//
// tokenizers runs these patterns with Oniguruma. The two read the syntax tokenizers' files use
// alike (classes, (?i:..), lookahead, {m,n}), but Oniguruma's Unicode is newer than PCRE2's, and its
// \s, \d and \w are defined otherwise: Regex writes each Unicode class of a pattern out as
// regex_tables.hpp says (scripts/gen-regex-tables asks both engines about every code point).

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <dtrain/version.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace data::detail {

class Regex {
 public:
  /// Compiles `pattern` (UTF-8, Unicode classes). Throws DataError naming the pattern and PCRE2's
  /// reason, or how to install PCRE2 when it cannot be loaded (the caller says whose pattern).
  explicit Regex(std::string pattern);

  /// Appends to `out` the [begin, end) byte ranges of the non-empty matches in `text`, left to
  /// right, as Oniguruma's iteration finds them (after an empty match the search goes on one
  /// character further). Bytes that are not UTF-8 are never part of a match.
  void matches(std::string_view text, std::vector<std::pair<std::uint32_t, std::uint32_t>>& out) const;

  const std::string& pattern() const { return pattern_; }

  /// `pattern` with its Unicode classes (\p{..}, \d, \s, \w and their negations) written out to
  /// match as Oniguruma's: what is compiled.
  static std::string as_oniguruma(std::string_view pattern);

 private:
  std::string pattern_;
  std::shared_ptr<void> code_;  // pcre2_code_8*
};

}  // namespace data::detail

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/data/detail/impl/regex.ipp>
#endif
