// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of bert_text.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/data/detail/bert_text.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace data {
namespace detail {
namespace unicode {

DTRAIN_INLINE std::uint8_t classes(char32_t cp) {
  struct Ascii {
    std::uint8_t bits[128] = {};
    constexpr Ascii() {
      for (const auto& r : kClasses)
        for (char32_t c = r.lo; c <= r.hi && c < 128; ++c) bits[c] = r.bits;
    }
  };
  static constexpr Ascii ascii;
  if (cp < 128) return ascii.bits[cp];
  const auto* end = std::end(kClasses);
  const auto* it = std::upper_bound(std::begin(kClasses), end, cp, [](char32_t c, const ClassRange& r) { return c < r.lo; });
  if (it == std::begin(kClasses)) return 0;
  --it;
  return cp <= it->hi ? it->bits : 0;
}

DTRAIN_INLINE bool cjk(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
         (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

DTRAIN_INLINE void lower(char32_t cp, std::vector<char32_t>& out) {
  if (cp < 128) {
    out.push_back(cp >= 'A' && cp <= 'Z' ? cp + 32 : cp);
    return;
  }
  const auto* it = std::upper_bound(std::begin(kLower), std::end(kLower), cp,
                                    [](char32_t c, const LowerRun& r) { return c < r.lo; });
  if (it != std::begin(kLower)) {
    --it;
    if (cp <= it->hi && (cp - it->lo) % it->stride == 0) {
      out.push_back(static_cast<char32_t>(static_cast<std::int32_t>(cp) + it->delta));
      return;
    }
  }
  if (const auto* m = find_cp(std::begin(kLowerMulti), std::end(kLowerMulti), cp)) {
    out.insert(out.end(), kLowerMultiPool + m->start, kLowerMultiPool + m->start + m->n);
    return;
  }
  out.push_back(cp);
}

DTRAIN_INLINE std::uint8_t combining_class(char32_t cp) {
  if (cp < 0x300) return 0;
  const auto* it = std::upper_bound(std::begin(kCombining), std::end(kCombining), cp,
                                    [](char32_t c, const CombiningRange& r) { return c < r.lo; });
  if (it == std::begin(kCombining)) return 0;
  --it;
  return cp <= it->hi ? it->ccc : 0;
}

DTRAIN_INLINE char32_t next_utf8(std::string_view s, std::size_t& i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  const auto cont = [&](std::size_t k) {
    return i + k < s.size() && (static_cast<unsigned char>(s[i + k]) & 0xC0) == 0x80;
  };
  const auto at = [&](std::size_t k) { return static_cast<char32_t>(static_cast<unsigned char>(s[i + k]) & 0x3F); };
  char32_t cp = 0xFFFD;
  std::size_t n = 1;
  if (b0 >= 0xC2 && b0 < 0xE0 && cont(1)) {
    cp = ((b0 & 0x1Fu) << 6) | at(1), n = 2;
  } else if (b0 >= 0xE0 && b0 < 0xF0 && cont(1) && cont(2)) {
    cp = ((b0 & 0x0Fu) << 12) | (at(1) << 6) | at(2), n = 3;
    if (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF)) cp = 0xFFFD;
  } else if (b0 >= 0xF0 && b0 < 0xF5 && cont(1) && cont(2) && cont(3)) {
    cp = ((b0 & 0x07u) << 18) | (at(1) << 12) | (at(2) << 6) | at(3), n = 4;
    if (cp < 0x10000 || cp > 0x10FFFF) cp = 0xFFFD;
  }
  i += n;
  return cp;
}

DTRAIN_INLINE void put_utf8(char32_t c, std::string& out) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}
}  // namespace unicode

DTRAIN_INLINE void BertNormalizer::operator()(std::string_view text, std::vector<char32_t>& out) const {
  namespace u = unicode;
  out.clear();
  bool marks = false;  // a character with a combining class or a non-spacing mark was appended
  const auto put = [&](char32_t c) {
    if (c >= 0x300) marks = true;
    if (lowercase) u::lower(c, out);
    else out.push_back(c);
  };
  for (std::size_t i = 0; i < text.size();) {
    char32_t c;
    if (static_cast<unsigned char>(text[i]) < 0x80) {  // ASCII: no decomposition, no mark
      c = static_cast<unsigned char>(text[i++]);
      const auto k = u::classes(c);
      if (clean_text && (c == 0 || (k & u::kDrop))) continue;
      if (clean_text && (k & u::kSpace)) c = ' ';
      out.push_back(lowercase && c >= 'A' && c <= 'Z' ? c + 32 : c);
      continue;
    }
    c = u::next_utf8(text, i);
    const auto k = u::classes(c);
    if (clean_text && (c == 0xFFFD || (k & u::kDrop))) continue;
    if (clean_text && (k & u::kSpace)) {
      out.push_back(' ');
      continue;
    }
    const bool pad = handle_chinese_chars && u::cjk(c);
    if (pad) out.push_back(' ');
    if (strip_accents) u::decompose(c, put);
    else put(c);
    if (pad) out.push_back(' ');
  }
  if (strip_accents && marks) strip_marks(out);
}

DTRAIN_INLINE void BertNormalizer::strip_marks(std::vector<char32_t>& s) {
  for (std::size_t i = 0; i < s.size();) {
    if (unicode::combining_class(s[i]) == 0) {
      ++i;
      continue;
    }
    auto j = i;
    while (j < s.size() && unicode::combining_class(s[j]) != 0) ++j;
    std::stable_sort(s.begin() + static_cast<std::ptrdiff_t>(i), s.begin() + static_cast<std::ptrdiff_t>(j),
                     [](char32_t a, char32_t b) { return unicode::combining_class(a) < unicode::combining_class(b); });
    i = j;
  }
  std::erase_if(s, [](char32_t c) { return c >= 0x300 && (unicode::classes(c) & unicode::kMark); });
}
}  // namespace detail
}  // namespace data
DTRAIN_NAMESPACE_END
