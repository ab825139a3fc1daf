// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of bpe_text.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <algorithm>
#include <iterator>

#include <dtrain/data/detail/bpe_text.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace data::detail::bpe {

DTRAIN_INLINE std::uint8_t classes(char32_t cp) {
  using unicode::BpeClassRange;
  using unicode::kBpeClasses;
  struct Ascii {
    std::uint8_t bits[128] = {};
    constexpr Ascii() {
      for (const auto& r : kBpeClasses)
        for (char32_t c = r.lo; c <= r.hi && c < 128; ++c) bits[c] = r.bits;
    }
  };
  static constexpr Ascii ascii;
  if (cp < 128) return ascii.bits[cp];
  const auto* it = std::upper_bound(std::begin(kBpeClasses), std::end(kBpeClasses), cp,
                                    [](char32_t c, const BpeClassRange& r) { return c < r.lo; });
  if (it == std::begin(kBpeClasses)) return 0;
  --it;
  return cp <= it->hi ? it->bits : 0;
}

// What a UTF-8 lead byte needs: continuation bytes, and the range of the first one (which rules
// out overlong forms, surrogates and code points above U+10FFFF). need 0: not a lead byte.
struct Lead {
  int need;
  unsigned char lo, hi;
  char32_t bits;
};
inline Lead lead(unsigned char b) {
  if (b >= 0xC2 && b <= 0xDF) return {1, 0x80, 0xBF, static_cast<char32_t>(b & 0x1F)};
  if (b >= 0xE0 && b <= 0xEF)
    return {2, static_cast<unsigned char>(b == 0xE0 ? 0xA0 : 0x80), static_cast<unsigned char>(b == 0xED ? 0x9F : 0xBF),
            static_cast<char32_t>(b & 0x0F)};
  if (b >= 0xF0 && b <= 0xF4)
    return {3, static_cast<unsigned char>(b == 0xF0 ? 0x90 : 0x80), static_cast<unsigned char>(b == 0xF4 ? 0x8F : 0xBF),
            static_cast<char32_t>(b & 0x07)};
  return {0, 0, 0, 0};
}

DTRAIN_INLINE Char char_at(std::string_view s, std::size_t i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) return {b0, 1, classes(b0)};
  constexpr Char invalid{0x110000, 1, 0};
  const auto l = lead(b0);
  if (l.need == 0) return invalid;
  char32_t cp = l.bits;
  for (int k = 1; k <= l.need; ++k) {
    if (i + static_cast<std::size_t>(k) >= s.size()) return invalid;
    const auto b = static_cast<unsigned char>(s[i + static_cast<std::size_t>(k)]);
    if (k == 1 ? (b < l.lo || b > l.hi) : (b & 0xC0) != 0x80) return invalid;
    cp = (cp << 6) | (b & 0x3F);
  }
  return {cp, static_cast<std::uint8_t>(l.need + 1), classes(cp)};
}

constexpr std::uint8_t kClassed = kLetter | kNumber | kSpace;
inline bool other(const Char& c) { return !(c.bits & kClassed); }

// The bytes after an apostrophe at s[i - 1] that a contraction ('s 't 're 've 'm 'll 'd) takes, or
// 0. `fold`: case-insensitive as Oniguruma's (?i:...) is here, ASCII case and U+017F as s
// (scripts/gen-bpe-tables checks that no other character folds to these letters).
inline std::size_t contraction(std::string_view s, std::size_t i, bool fold) {
  const auto letter = [&](std::size_t j, std::size_t& bytes) -> char32_t {
    if (j >= s.size()) return 0;
    const auto c = char_at(s, j);
    bytes = c.bytes;
    if (!fold) return c.cp;
    if (c.cp >= 'A' && c.cp <= 'Z') return c.cp + 32;
    return c.cp == 0x17F ? U's' : c.cp;
  };
  std::size_t n1 = 0, n2 = 0;
  const auto a = letter(i, n1);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return n1;
  if (a != 'r' && a != 'v' && a != 'l') return 0;
  const auto b = letter(i + n1, n2);
  return (a == 'l' ? b == 'l' : b == 'e') ? n1 + n2 : 0;
}

template <class Pred>
std::size_t run(std::string_view s, std::size_t i, Pred&& p) {
  while (i < s.size()) {
    const auto c = char_at(s, i);
    if (!p(c)) break;
    i += c.bytes;
  }
  return i;
}

// A run of whitespace from s[i] as the patterns' last alternatives take it: `\s+(?!\S)` (all of it
// at the end of the text, else all but its last character when that leaves one) else `\s+`; with
// `newlines`, `\s*[\r\n]+` first (up to and with the run's last \r or \n).
inline std::size_t whitespace(std::string_view s, std::size_t i, bool newlines) {
  std::size_t end = i, last = i, count = 0, newline = std::string_view::npos;
  while (end < s.size()) {
    const auto c = char_at(s, end);
    if (!(c.bits & kSpace)) break;
    if (c.cp == '\r' || c.cp == '\n') newline = end;
    last = end;
    end += c.bytes;
    ++count;
  }
  if (newlines && newline != std::string_view::npos) return newline + 1;
  return end == s.size() || count == 1 ? end : last;
}

DTRAIN_INLINE void split(Pattern pattern, std::string_view s,
                         std::vector<std::pair<std::uint32_t, std::uint32_t>>& out) {
  const auto is = [](std::uint8_t bit) { return [bit](const Char& c) { return (c.bits & bit) != 0; }; };
  const auto is_other = [](const Char& c) { return other(c); };
  const std::size_t n = s.size();
  std::size_t i = 0;
  while (i < n) {
    const auto a = char_at(s, i);
    std::size_t end = 0;
    if (a.cp == '\'') {
      if (const auto k = contraction(s, i + 1, pattern != Pattern::gpt2)) {
        out.emplace_back(static_cast<std::uint32_t>(i), static_cast<std::uint32_t>(i + 1 + k));
        i += 1 + k;
        continue;
      }
    }
    if (pattern == Pattern::gpt2) {
      // ` ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+`, then whitespace.
      const bool space = a.cp == ' ' && i + 1 < n;
      const auto j = space ? i + 1 : i;
      const auto b = space ? char_at(s, j) : a;
      if (b.bits & kLetter)
        end = run(s, j, is(kLetter));
      else if (b.bits & kNumber)
        end = run(s, j, is(kNumber));
      else if (other(b))
        end = run(s, j, is_other);
      else
        end = whitespace(s, i, false);
    } else {
      const bool newline = a.cp == '\r' || a.cp == '\n';
      if (a.bits & kLetter) {  // [^\r\n\p{L}\p{N}]?\p{L}+, without the optional character
        end = run(s, i, is(kLetter));
      } else if (!newline && !(a.bits & kNumber) && i + a.bytes < n && (char_at(s, i + a.bytes).bits & kLetter)) {
        end = run(s, i + a.bytes, is(kLetter));  // ... with it
      } else if (a.bits & kNumber) {             // \p{N}{1,3} (Qwen2: \p{N})
        end = i;
        for (int k = 0, most = pattern == Pattern::llama3 ? 3 : 1; k < most && end < n; ++k) {
          const auto c = char_at(s, end);
          if (!(c.bits & kNumber)) break;
          end += c.bytes;
        }
      } else if (other(a) || (a.cp == ' ' && i + 1 < n && other(char_at(s, i + 1)))) {  // ?[^\s\p{L}\p{N}]+[\r\n]*
        end = run(s, a.cp == ' ' ? i + 1 : i, is_other);
        end = run(s, end, [](const Char& c) { return c.cp == '\r' || c.cp == '\n'; });
      } else {
        end = whitespace(s, i, true);
      }
    }
    out.emplace_back(static_cast<std::uint32_t>(i), static_cast<std::uint32_t>(end));
    i = end;
  }
}

struct ByteMaps {
  std::array<std::string, 256> chars;
  std::array<int, 0x144> bytes{};  // the characters are below U+0144
  ByteMaps() {
    bytes.fill(-1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const char32_t c = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
      bytes[c] = b;
      auto& s = chars[static_cast<std::size_t>(b)];
      if (c < 0x80) {
        s.push_back(static_cast<char>(c));
      } else {
        s.push_back(static_cast<char>(0xC0 | (c >> 6)));
        s.push_back(static_cast<char>(0x80 | (c & 0x3F)));
      }
    }
  }
};
inline const ByteMaps& byte_maps() {
  static const ByteMaps maps;
  return maps;
}

DTRAIN_INLINE const std::array<std::string, 256>& byte_chars() { return byte_maps().chars; }

DTRAIN_INLINE int char_byte(char32_t c) { return c < 0x144 ? byte_maps().bytes[c] : -1; }

DTRAIN_INLINE bool token_bytes(std::string_view token, std::string& out) {
  out.clear();
  for (std::size_t i = 0; i < token.size();) {
    const auto c = char_at(token, i);
    const auto b = char_byte(c.cp);
    if (b < 0) return false;
    out.push_back(static_cast<char>(b));
    i += c.bytes;
  }
  return true;
}

DTRAIN_INLINE std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    const auto b0 = static_cast<unsigned char>(s[i]);
    if (b0 < 0x80) {
      out.push_back(static_cast<char>(b0));
      ++i;
      continue;
    }
    const auto l = lead(b0);
    std::size_t k = 1;  // bytes of a valid prefix, the lead byte included
    if (l.need > 0) {
      for (; k <= static_cast<std::size_t>(l.need) && i + k < s.size(); ++k) {
        const auto b = static_cast<unsigned char>(s[i + k]);
        if (k == 1 ? (b < l.lo || b > l.hi) : (b & 0xC0) != 0x80) break;
      }
      if (k == static_cast<std::size_t>(l.need) + 1) {  // a whole character
        out.append(s.substr(i, k));
        i += k;
        continue;
      }
    }
    out += "\xEF\xBF\xBD";  // U+FFFD for the maximal invalid prefix
    i += k;
  }
  return out;
}

// The canonical combining class as tokenizers' NFC has it.
inline std::uint8_t nfc_class(char32_t c) {
  using unicode::CodeRange;
  using unicode::kNfcUnknownMarks;
  if (c < 0x300 || c >= 0x110000) return 0;
  const auto* it = std::upper_bound(std::begin(kNfcUnknownMarks), std::end(kNfcUnknownMarks), c,
                                    [](char32_t x, const CodeRange& r) { return x < r.lo; });
  if (it != std::begin(kNfcUnknownMarks) && c <= (it - 1)->hi) return 0;
  return unicode::combining_class(c);
}

// The canonical composition of `a` then `b`, or 0.
inline char32_t compose(char32_t a, char32_t b) {
  using unicode::Composition;
  using unicode::kCompositions;
  if (a >= 0x1100 && a <= 0x1112 && b >= 0x1161 && b <= 0x1175) return 0xAC00 + ((a - 0x1100) * 21 + (b - 0x1161)) * 28;
  if (a >= 0xAC00 && a <= 0xD7A3 && (a - 0xAC00) % 28 == 0 && b >= 0x11A8 && b <= 0x11C2) return a + (b - 0x11A7);
  const auto* it = std::lower_bound(std::begin(kCompositions), std::end(kCompositions), std::pair{a, b},
                                    [](const Composition& e, const std::pair<char32_t, char32_t>& k) {
                                      return e.first != k.first ? e.first < k.first : e.second < k.second;
                                    });
  return it != std::end(kCompositions) && it->first == a && it->second == b ? it->composite : 0;
}

DTRAIN_INLINE void nfc(std::string_view s, std::string& out) {
  out.clear();
  // Below U+0300 (UTF-8 lead bytes below 0xCC) every character is its own NFC.
  if (std::none_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) >= 0xCC; })) {
    out.assign(s);
    return;
  }
  constexpr char32_t kByte = 0x110000;  // a byte that is not UTF-8: kByte + the byte
  thread_local std::vector<char32_t> buf;
  buf.clear();
  for (std::size_t i = 0; i < s.size();) {
    const auto c = char_at(s, i);
    if (c.cp >= 0x110000)
      buf.push_back(kByte + static_cast<unsigned char>(s[i]));
    else
      unicode::decompose(c.cp, [&](char32_t d) { buf.push_back(d); });
    i += c.bytes;
  }
  for (std::size_t i = 0; i < buf.size();) {  // canonical order: each run of marks, stably by class
    auto j = i;
    while (j < buf.size() && nfc_class(buf[j])) ++j;
    if (j - i > 1)
      std::stable_sort(buf.begin() + static_cast<std::ptrdiff_t>(i), buf.begin() + static_cast<std::ptrdiff_t>(j),
                       [](char32_t x, char32_t y) { return nfc_class(x) < nfc_class(y); });
    i = j + 1;
  }
  // Each character joins the last starter unless blocked: something between them of class 0, or
  // of its class or higher.
  std::size_t starter = std::string::npos, kept = 0;
  std::uint8_t last = 0;
  for (std::size_t r = 0; r < buf.size(); ++r) {
    const auto c = buf[r];
    const auto k = nfc_class(c);
    if (starter != std::string::npos && (last == 0 || last < k) && c < kByte && buf[starter] < kByte) {
      if (const auto joined = compose(buf[starter], c)) {
        buf[starter] = joined;
        continue;
      }
    }
    if (k == 0) starter = kept;
    last = k;
    buf[kept++] = c;
  }
  for (std::size_t i = 0; i < kept; ++i) {
    if (buf[i] >= kByte)
      out.push_back(static_cast<char>(buf[i] - kByte));
    else
      unicode::put_utf8(buf[i], out);
  }
}

DTRAIN_INLINE void Splitter::pieces(std::string_view text,
                                    std::vector<std::pair<std::uint32_t, std::uint32_t>>& out) const {
  if (scanner && keep != gaps) return split(*scanner, text, out);  // its matches cover the text
  if (scanner) return;
  if (keep == matches) return regex->matches(text, out);
  thread_local std::vector<std::pair<std::uint32_t, std::uint32_t>> found;
  found.clear();
  regex->matches(text, found);
  std::uint32_t from = 0;
  for (const auto& m : found) {
    if (m.first > from) out.emplace_back(from, m.first);
    if (keep == all) out.push_back(m);
    from = m.second;
  }
  if (from < text.size()) out.emplace_back(from, static_cast<std::uint32_t>(text.size()));
}

DTRAIN_INLINE void lowercase(std::string_view text, std::string& out) {
  out.clear();
  out.reserve(text.size());
  thread_local std::vector<char32_t> lower;
  for (std::size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      out.push_back(c >= 'A' && c <= 'Z' ? static_cast<char>(c + 32) : static_cast<char>(c));
      ++i;
      continue;
    }
    const auto ch = char_at(text, i);
    if (ch.cp > 0x10FFFF) {
      out.push_back(text[i]);  // a byte that does not begin UTF-8 (char_at's invalid character)
    } else {
      lower.clear();
      unicode::lower(ch.cp, lower);
      for (const auto l : lower) unicode::put_utf8(l, out);
    }
    i += ch.bytes;
  }
}

}  // namespace data::detail::bpe
DTRAIN_NAMESPACE_END
