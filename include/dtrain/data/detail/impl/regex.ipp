// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of regex.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dlfcn.h>

#include <cstddef>
#include <optional>

#include <dtrain/data/detail/regex.hpp>
#include <dtrain/data/detail/regex_tables.hpp>
#include <dtrain/error.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace data::detail {

namespace pcre2 {
// The part of pcre2.h (10.x, whose API and option bits are stable) that Regex uses: the library is
// opened at run time, so its development headers are not needed to build.
constexpr std::uint32_t kUcp = 0x00020000u, kUtf = 0x00080000u, kMatchInvalidUtf = 0x04000000u;
constexpr std::uint32_t kJitComplete = 0x00000001u;
constexpr int kNoMatch = -1;

struct Library {
  void* (*compile)(const unsigned char*, std::size_t, std::uint32_t, int*, std::size_t*, void*);
  void (*code_free)(void*);
  int (*jit_compile)(void*, std::uint32_t);
  void* (*match_data_create)(std::uint32_t, void*);
  void (*match_data_free)(void*);
  int (*match)(const void*, const unsigned char*, std::size_t, std::size_t, std::uint32_t, void*, void*);
  std::size_t* (*ovector)(void*);
  int (*error_message)(int, unsigned char*, std::size_t);

  static const Library& get() {
    static const Library library;  // C++ makes the first call's construction thread-safe
    return library;
  }

 private:
  Library() {
    void* so = ::dlopen("libpcre2-8.so.0", RTLD_NOW | RTLD_LOCAL);
    if (!so) {
      const char* why = ::dlerror();
      throw DataError(std::string("its regular expression needs PCRE2, and "
                                  "libpcre2-8.so.0 does not load (") +
                      (why ? why : "unknown") + "); install it: apt-get install libpcre2-8-0");
    }
    bind(so, compile, "pcre2_compile_8");
    bind(so, code_free, "pcre2_code_free_8");
    bind(so, jit_compile, "pcre2_jit_compile_8");
    bind(so, match_data_create, "pcre2_match_data_create_8");
    bind(so, match_data_free, "pcre2_match_data_free_8");
    bind(so, match, "pcre2_match_8");
    bind(so, ovector, "pcre2_get_ovector_pointer_8");
    bind(so, error_message, "pcre2_get_error_message_8");
  }
  template <class F>
  static void bind(void* so, F& f, const char* name) {
    f = reinterpret_cast<F>(::dlsym(so, name));
    if (!f) throw DataError(std::string("libpcre2-8.so.0 has no ") + name + ": it is not PCRE2 10.x");
  }
};

// A thread's match data: one pair of offsets (the whole match) is all Regex reads.
struct MatchData {
  const Library& lib = Library::get();
  void* data = lib.match_data_create(1, nullptr);
  MatchData() {
    if (!data) throw std::bad_alloc();
  }
  ~MatchData() { lib.match_data_free(data); }
  MatchData(const MatchData&) = delete;
  MatchData& operator=(const MatchData&) = delete;
};
}  // namespace pcre2

DTRAIN_INLINE std::string Regex::as_oniguruma(std::string_view p) {
  // The class that `name` (a general category, or d, s, w) stands for, as regex_tables.hpp writes it.
  const auto body = [](std::string_view name) -> std::optional<std::string_view> {
    for (const auto& c : regex_tables::kClasses)
      if (c.name == name) return c.body;
    return std::nullopt;
  };
  std::string out;
  out.reserve(p.size() + 256);
  bool in_class = false;
  for (std::size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char d = p[++i];
      const auto begin = i - 1;
      std::string_view name;  // the class the escape names, when it is one regex_tables.hpp has
      bool negated = false;
      if (d == 'd' || d == 's' || d == 'w' || d == 'D' || d == 'S' || d == 'W') {
        name = std::string_view(p).substr(i, 1);
        negated = d == 'D' || d == 'S' || d == 'W';
        if (negated) name = d == 'D' ? "d" : d == 'S' ? "s" : "w";
      } else if ((d == 'p' || d == 'P') && i + 1 < p.size()) {
        negated = d == 'P';
        if (p[i + 1] == '{') {
          const auto close = p.find('}', i + 2);
          if (close != std::string_view::npos) {
            name = p.substr(i + 2, close - i - 2);
            if (body(name)) i = close;
          }
        } else {
          name = p.substr(i + 1, 1);
          if (body(name)) ++i;
        }
      }
      const auto written = name.empty() ? std::nullopt : body(name);
      if (!written) {  // an escape PCRE2 reads as Oniguruma does: as it is
        out.append(p.substr(begin, i + 1 - begin));
        continue;
      }
      if (in_class && negated)
        throw DataError("the pattern \"" + std::string(p) + "\" has " + std::string(p.substr(begin, i + 1 - begin)) +
                        " inside a character class, which BpeTokenizer cannot run as tokenizers does; write the "
                        "class without it");
      out.append(in_class ? "" : negated ? "[^" : "[").append(*written).append(in_class ? "" : "]");
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out.push_back(c);
      if (i + 1 < p.size() && p[i + 1] == '^') out.push_back(p[++i]);
      if (i + 1 < p.size() && p[i + 1] == ']') out.push_back(p[++i]);  // a leading ] is a literal
      continue;
    }
    if (in_class && c == '[' && i + 1 < p.size() && p[i + 1] == ':') {  // [:alpha:] inside a class
      const auto close = p.find(":]", i + 2);
      if (close != std::string_view::npos) {
        out.append(p.substr(i, close + 2 - i));
        i = close + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out.push_back(c);
  }
  return out;
}

DTRAIN_INLINE Regex::Regex(std::string pattern) : pattern_(std::move(pattern)) {
  const auto& lib = pcre2::Library::get();
  const auto compiled = as_oniguruma(pattern_);
  int error = 0;
  std::size_t offset = 0;
  void* code = lib.compile(reinterpret_cast<const unsigned char*>(compiled.data()), compiled.size(),
                           pcre2::kUtf | pcre2::kUcp | pcre2::kMatchInvalidUtf, &error, &offset, nullptr);
  if (!code) {
    unsigned char message[256] = {};
    lib.error_message(error, message, sizeof message);
    // PCRE2's offset counts in the rewritten pattern, with its classes written out: not told.
    throw DataError("the regular expression \"" + pattern_ + "\" does not compile: " +
                    reinterpret_cast<const char*>(message) + " (PCRE2)");
  }
  lib.jit_compile(code, pcre2::kJitComplete);  // where JIT is unavailable, pcre2_match interprets
  code_ = std::shared_ptr<void>(code, lib.code_free);
}

DTRAIN_INLINE void Regex::matches(std::string_view text,
                                  std::vector<std::pair<std::uint32_t, std::uint32_t>>& out) const {
  thread_local pcre2::MatchData match;
  const auto& lib = match.lib;
  const auto* subject = reinterpret_cast<const unsigned char*>(text.data());
  std::size_t from = 0;
  while (from < text.size()) {
    const int rc = lib.match(code_.get(), subject, text.size(), from, 0, match.data, nullptr);
    if (rc == pcre2::kNoMatch) return;
    if (rc < 0) {
      unsigned char message[256] = {};
      lib.error_message(rc, message, sizeof message);
      throw DataError("BpeTokenizer: matching \"" + pattern_ + "\" failed: " + reinterpret_cast<const char*>(message));
    }
    const auto* ov = lib.ovector(match.data);
    const std::size_t begin = ov[0], end = ov[1];
    if (end > begin) {
      out.emplace_back(static_cast<std::uint32_t>(begin), static_cast<std::uint32_t>(end));
      from = end;
    } else if (begin < text.size()) {  // an empty match: on past the character there
      const auto lead = static_cast<unsigned char>(text[begin]);
      from = begin + (lead < 0xC0 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4);
    } else {
      return;  // an empty match at the end
    }
  }
}

}  // namespace data::detail
DTRAIN_NAMESPACE_END
