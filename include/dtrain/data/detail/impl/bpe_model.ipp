// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of bpe_model.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <algorithm>
#include <atomic>

#include <dtrain/data/detail/bpe_model.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace data::detail {

DTRAIN_INLINE void MergeTable::put(std::uint32_t left, std::uint32_t right, std::uint32_t rank, std::uint32_t id) {
  if ((size_ + 1) * 2 > slots_.size()) grow();
  const auto key = (std::uint64_t{left} << 32) | right;
  for (auto i = slot_of(key);; i = (i + 1) & mask_) {
    auto& s = slots_[i];
    if (s.key == key || s.key == kEmpty) {
      size_ += s.key == kEmpty;
      s = {key, (std::uint64_t{rank} << 32) | id};
      return;
    }
  }
}

DTRAIN_INLINE void MergeTable::grow() {
  auto old = std::move(slots_);
  const std::size_t n = std::max<std::size_t>(64, old.size() * 2);
  slots_.assign(n, Slot{});
  mask_ = n - 1;
  shift_ = 64;
  for (std::size_t k = n; k > 1; k >>= 1) --shift_;
  for (const auto& s : old) {
    if (s.key == kEmpty) continue;
    auto i = slot_of(s.key);
    while (slots_[i].key != kEmpty) i = (i + 1) & mask_;
    slots_[i] = s;
  }
}

DTRAIN_INLINE void AddedTrie::add(std::string_view pattern, std::uint32_t token) {
  if (pattern.empty()) return;
  first_[static_cast<unsigned char>(pattern[0])] = true;
  std::uint32_t node = 0;
  for (const char ch : pattern) {
    const auto c = static_cast<unsigned char>(ch);
    auto& next = nodes_[node].next;
    auto it = std::lower_bound(next.begin(), next.end(), c, [](const auto& e, unsigned char x) { return e.first < x; });
    if (it != next.end() && it->first == c) {
      node = it->second;
      continue;
    }
    const auto child = static_cast<std::uint32_t>(nodes_.size());
    next.insert(it, {c, child});
    nodes_.emplace_back();
    node = child;
  }
  nodes_[node].token = token;  // a pattern given twice: the later token
}

DTRAIN_INLINE std::pair<std::uint32_t, std::size_t> AddedTrie::longest(std::string_view text, std::size_t i) const {
  std::pair<std::uint32_t, std::size_t> best{0, 0};
  std::uint32_t node = 0;
  for (auto k = i; k < text.size(); ++k) {
    const auto c = static_cast<unsigned char>(text[k]);
    const auto& next = nodes_[node].next;
    auto it = std::lower_bound(next.begin(), next.end(), c, [](const auto& e, unsigned char x) { return e.first < x; });
    if (it == next.end() || it->first != c) break;
    node = it->second;
    if (nodes_[node].token >= 0) best = {static_cast<std::uint32_t>(nodes_[node].token), k + 1 - i};
  }
  return best;
}

namespace bpe {
// tokenizers' AddedVocabulary::find_matches: the leftmost-longest matches of `trie` in `text`, a
// single_word match dropped when a word character (the regex crate's \w) touches it, lstrip and
// rstrip taking the whitespace beside it. piece(begin, end) for the text between, token(id).
template <class Piece, class Token>
void cut(const BpeModel& m, const AddedTrie& trie, std::string_view text, Piece&& piece, Token&& token) {
  const auto last_char = [&](std::size_t end) {  // the character that ends text[0, end)
    auto b = end - 1;
    while (b > 0 && (static_cast<unsigned char>(text[b]) & 0xC0) == 0x80 && end - b < 4) --b;
    auto c = char_at(text, b);
    if (b + c.bytes != end) c = char_at(text, end - 1);  // not valid UTF-8: the byte alone
    return c;
  };
  std::size_t done = 0;
  for (std::size_t i = 0; i < text.size();) {
    if (!trie.may_start(static_cast<unsigned char>(text[i]))) {
      ++i;
      continue;
    }
    const auto [index, bytes] = trie.longest(text, i);
    if (bytes == 0) {
      ++i;
      continue;
    }
    auto start = i, stop = i + bytes;
    i = stop;
    const auto& a = m.added[index];
    if (a.single_word &&
        ((start > 0 && (last_char(start).bits & kWord)) || (stop < text.size() && (char_at(text, stop).bits & kWord))))
      continue;
    if (a.lstrip) {
      auto s = start;
      while (s > 0) {
        const auto c = last_char(s);
        if (!(c.bits & kSpace)) break;
        s -= c.bytes;
      }
      start = std::max(s, done);
    }
    if (a.rstrip) {
      while (stop < text.size()) {
        const auto c = char_at(text, stop);
        if (!(c.bits & kSpace)) break;
        stop += c.bytes;
      }
    }
    if (done < start) piece(done, start);
    token(a.id);
    done = stop;
  }
  if (done < text.size()) piece(done, text.size());
}
}  // namespace bpe

DTRAIN_INLINE void BpeModel::encode(std::string_view text, bool special, std::vector<std::int64_t>& ids) const {
  ids.clear();
  if (raw_trie.empty()) {
    segment(text, true, ids);
  } else {
    bpe::cut(
        *this, raw_trie, text, [&](std::size_t b, std::size_t e) { segment(text.substr(b, e - b), b == 0, ids); },
        [&](std::uint32_t id) { ids.push_back(id); });
  }
  if (max_length) {
    const auto room = static_cast<std::size_t>(*max_length) - (special ? begin_ids.size() + end_ids.size() : 0);
    if (ids.size() > room) {
      if (truncate_left)
        ids.erase(ids.begin(), ids.end() - static_cast<std::ptrdiff_t>(room));
      else
        ids.resize(room);
    }
  }
  if (special) {
    ids.insert(ids.begin(), begin_ids.begin(), begin_ids.end());
    ids.insert(ids.end(), end_ids.begin(), end_ids.end());
  }
}

DTRAIN_INLINE void BpeModel::segment(std::string_view text, bool at_origin, std::vector<std::int64_t>& ids) const {
  if (text.empty()) return;
  thread_local std::string normalized;
  if (!normalizers.empty()) {
    normalize(text, normalized);
    text = normalized;
  }
  if (normalized_trie.empty()) return pre_tokenized(text, at_origin, ids);
  bpe::cut(
      *this, normalized_trie, text,
      [&](std::size_t b, std::size_t e) { pre_tokenized(text.substr(b, e - b), at_origin && b == 0, ids); },
      [&](std::uint32_t id) { ids.push_back(id); });
}

DTRAIN_INLINE void BpeModel::normalize(std::string_view text, std::string& out) const {
  out.assign(text);
  thread_local std::string next;
  for (const auto& n : normalizers) {
    if (n.kind == Normalize::nfc) {
      bpe::nfc(out, next);
      out.swap(next);
    } else if (n.kind == Normalize::lowercase) {
      bpe::lowercase(out, next);
      out.swap(next);
    } else if (n.kind == Normalize::prepend) {
      if (!out.empty()) out.insert(0, n.text);  // tokenizers' Prepend leaves an empty text empty
    } else if (n.pattern) {                     // Replace of a Regex: every match, left to right
      thread_local std::vector<std::pair<std::uint32_t, std::uint32_t>> found;
      found.clear();
      n.pattern->matches(out, found);
      next.clear();
      std::size_t from = 0;
      for (const auto& [b, e] : found) {
        next.append(out, from, b - from).append(n.by);
        from = e;
      }
      next.append(out, from);
      out.swap(next);
    } else if (!n.text.empty()) {  // Replace of a string: every occurrence, left to right
      next.clear();
      std::size_t from = 0;
      for (auto at = out.find(n.text); at != std::string::npos; at = out.find(n.text, from)) {
        next.append(out, from, at - from).append(n.by);
        from = at + n.text.size();
      }
      next.append(out, from);
      out.swap(next);
    }
  }
}

DTRAIN_INLINE void BpeModel::pre_tokenized(std::string_view text, bool at_origin,
                                           std::vector<std::int64_t>& ids) const {
  if (text.empty()) return;
  if (!metaspace) return split_from(0, text, ids);
  // Metaspace: spaces become the replacement, which is prepended as the scheme says; the text is
  // split before each replacement (tokenizers' MergedWithNext).
  const auto& ms = *metaspace;
  thread_local std::string s;
  s.clear();
  if (ms.prepend == Metaspace::always || (ms.prepend == Metaspace::first && at_origin)) {
    // After the spaces are replaced, the text starts with the replacement when it started with
    // either.
    if (text[0] != ' ' && text.substr(0, ms.replacement.size()) != ms.replacement) s = ms.replacement;
  }
  for (const char c : text) {
    if (c == ' ')
      s += ms.replacement;
    else
      s += c;
  }
  if (!ms.split) return word(s, ids);
  std::size_t from = 0;
  for (auto at = s.find(ms.replacement, 1); at != std::string::npos;
       at = s.find(ms.replacement, at + ms.replacement.size())) {
    if (at > from) word(std::string_view(s).substr(from, at - from), ids);
    from = at;
  }
  word(std::string_view(s).substr(from), ids);
}

DTRAIN_INLINE void BpeModel::split_from(std::size_t step, std::string_view text, std::vector<std::int64_t>& ids) const {
  if (step < splits.size()) {
    thread_local std::vector<std::vector<std::pair<std::uint32_t, std::uint32_t>>> stack;
    if (stack.size() <= step) stack.resize(step + 1);
    auto pieces = std::move(stack[step]);  // split_from(step + 1) may use the deeper levels only
    pieces.clear();
    splits[step].pieces(text, pieces);
    for (const auto& [b, e] : pieces) split_from(step + 1, text.substr(b, e - b), ids);
    stack[step] = std::move(pieces);
    return;
  }
  if (byte_level_step) return byte_level_word(text, ids);
  word(text, ids);
}

DTRAIN_INLINE void BpeModel::byte_level_word(std::string_view piece, std::vector<std::int64_t>& ids) const {
  thread_local std::string spaced;
  if (add_prefix_space && piece[0] != ' ') {
    spaced.assign(1, ' ');
    spaced.append(piece);
    piece = spaced;
  }
  if (!byte_level_regex) return word(piece, ids);
  thread_local std::vector<std::pair<std::uint32_t, std::uint32_t>> words;
  words.clear();
  bpe::split(bpe::Pattern::gpt2, piece, words);
  for (const auto& [b, e] : words) word(piece.substr(b, e - b), ids);
}

DTRAIN_INLINE void BpeModel::word(std::string_view w, std::vector<std::int64_t>& ids) const {
  if (w.empty()) return;
  if (ignore_merges) {
    if (const auto k = vocab.find(w); k != TokenTable::absent) {
      ids.push_back(vocab_ids[static_cast<std::size_t>(k)]);
      return;
    }
  }
  BpeWordCache* cache = nullptr;
  if (w.size() < BpeWordCache::kMaxBytes) {
    cache = &BpeWordCache::of(*this);
    if (const auto k = cache->words.find(w); k != TokenTable::absent) {
      const auto i = static_cast<std::size_t>(k);
      ids.insert(ids.end(), cache->ids.begin() + (i ? cache->ends[i - 1] : 0), cache->ids.begin() + cache->ends[i]);
      return;
    }
  }
  thread_local std::vector<std::uint32_t> symbols;
  thread_local std::string key;
  symbols.clear();
  std::optional<std::uint32_t> unk;  // an unknown unit's [UNK] waits: fuse_unk joins the next one to it
  const auto known = [&](std::uint32_t id) {
    if (unk) symbols.push_back(*unk);
    unk.reset();
    symbols.push_back(id);
  };
  const auto n = w.size();
  if (byte_level) {
    for (std::size_t k = 0; k < n; ++k) {
      const int where = n == 1 ? 3 : k == 0 ? 0 : k + 1 == n ? 2 : 1;
      const auto b = static_cast<unsigned char>(w[k]);
      const auto id = unit_ids[static_cast<std::size_t>(where)][b];
      if (id >= 0) {
        known(static_cast<std::uint32_t>(id));
        continue;
      }
      key.assign(k > 0 ? prefix : std::string())
          .append(bpe::byte_chars()[b])
          .append(k + 1 == n ? suffix : std::string());
      unknown_unit(key, symbols, unk);
    }
  } else {
    for (std::size_t i = 0; i < n;) {
      const auto c = bpe::char_at(w, i);
      std::string_view unit = w.substr(i, c.bytes);
      if (!prefix.empty() || !suffix.empty()) {
        key.assign(i > 0 ? prefix : std::string()).append(unit).append(i + c.bytes == n ? suffix : std::string());
        unit = key;
      }
      i += c.bytes;
      if (const auto k = vocab.find(unit); k != TokenTable::absent)
        known(vocab_ids[static_cast<std::size_t>(k)]);
      else
        unknown_unit(unit, symbols, unk);
    }
  }
  if (unk) symbols.push_back(*unk);
  merge(symbols);
  ids.insert(ids.end(), symbols.begin(), symbols.end());
  if (cache) {
    if (cache->ends.size() >= BpeWordCache::kMaxWords) {
      *cache = BpeWordCache();
      cache->serial = serial;
    }
    cache->words.intern(w);
    cache->ids.insert(cache->ids.end(), symbols.begin(), symbols.end());
    cache->ends.push_back(static_cast<std::uint32_t>(cache->ids.size()));
  }
}

DTRAIN_INLINE std::uint64_t BpeModel::next_serial() {
  static std::atomic<std::uint64_t> next{1};
  return next++;
}

DTRAIN_INLINE BpeWordCache& BpeWordCache::of(const BpeModel& m) {
  thread_local BpeWordCache cache;
  if (cache.serial != m.serial) {
    cache = BpeWordCache();
    cache.serial = m.serial;
  }
  return cache;
}

DTRAIN_INLINE void BpeModel::unknown_unit(std::string_view key, std::vector<std::uint32_t>& symbols,
                                          std::optional<std::uint32_t>& unk) const {
  if (byte_fallback) {  // <0xXX> for each byte, when the vocabulary has them all
    bool all = true;
    for (const char c : key) all = all && byte_fallback_ids[static_cast<unsigned char>(c)] >= 0;
    if (all) {
      for (const char c : key)
        symbols.push_back(static_cast<std::uint32_t>(byte_fallback_ids[static_cast<unsigned char>(c)]));
      return;
    }
  }
  if (!unk_token) return;  // no unk_token: tokenizers drops the character
  if (!unk_id) fail("the unk_token " + *unk_token + " is not in model.vocab, and a text needs it");
  if (unk && fuse_unk) return;
  if (unk) symbols.push_back(*unk);
  unk = *unk_id;
}

DTRAIN_INLINE void BpeModel::merge(std::vector<std::uint32_t>& s) const {
  const auto n = s.size();
  if (n < 2) return;
  constexpr auto none = MergeTable::kNone;
  if (n <= 64) {
    // Lowest rank first, the leftmost of equals: what tokenizers' queue of (rank, position) pops.
    thread_local std::vector<std::uint64_t> pair;
    pair.resize(n - 1);
    for (std::size_t k = 0; k + 1 < n; ++k) pair[k] = merges.find(s[k], s[k + 1]);
    while (true) {
      std::size_t best = 0;
      for (std::size_t k = 1; k < pair.size(); ++k)
        if (pair[k] < pair[best]) best = k;
      if (pair.empty() || pair[best] == none) break;
      s[best] = static_cast<std::uint32_t>(pair[best]);
      s.erase(s.begin() + static_cast<std::ptrdiff_t>(best) + 1);
      pair.erase(pair.begin() + static_cast<std::ptrdiff_t>(best));
      if (best < pair.size()) pair[best] = merges.find(s[best], s[best + 1]);
      if (best > 0) pair[best - 1] = merges.find(s[best - 1], s[best]);
    }
    return;
  }
  // Long words: tokenizers' Word::merge_all, a queue of (rank, position) over linked symbols.
  struct Symbol {
    std::uint32_t id;
    std::int64_t prev, next;
    bool alive;
  };
  struct Merge {
    std::uint64_t rank_id;  // rank << 32 | merged id
    std::size_t pos;
    bool operator<(const Merge& o) const {  // the heap's top is the greatest: invert
      const auto rank = rank_id >> 32, other = o.rank_id >> 32;
      return rank != other ? rank > other : pos > o.pos;
    }
  };
  thread_local std::vector<Symbol> sym;
  thread_local std::vector<Merge> queue;  // a heap: std::push_heap / pop_heap keep the lowest on top
  sym.clear();
  queue.clear();
  const auto push = [&](std::uint64_t m, std::size_t pos) {
    queue.push_back({m, pos});
    std::push_heap(queue.begin(), queue.end());
  };
  for (std::size_t k = 0; k < n; ++k)
    sym.push_back({s[k], static_cast<std::int64_t>(k) - 1, k + 1 < n ? static_cast<std::int64_t>(k + 1) : -1, true});
  for (std::size_t k = 0; k + 1 < n; ++k)
    if (const auto m = merges.find(s[k], s[k + 1]); m != none) push(m, k);
  while (!queue.empty()) {
    std::pop_heap(queue.begin(), queue.end());
    const auto top = queue.back();
    queue.pop_back();
    auto& left = sym[top.pos];
    if (!left.alive || left.next < 0) continue;
    const auto right_pos = static_cast<std::size_t>(left.next);
    const auto right = sym[right_pos];
    const auto now = merges.find(left.id, right.id);
    if (now == none || static_cast<std::uint32_t>(now) != static_cast<std::uint32_t>(top.rank_id)) continue;  // stale
    left.id = static_cast<std::uint32_t>(top.rank_id);
    left.next = right.next;
    sym[right_pos].alive = false;
    if (right.next >= 0) sym[static_cast<std::size_t>(right.next)].prev = static_cast<std::int64_t>(top.pos);
    if (left.prev >= 0) {
      const auto p = static_cast<std::size_t>(left.prev);
      if (const auto m = merges.find(sym[p].id, left.id); m != none) push(m, p);
    }
    if (left.next >= 0)
      if (const auto m = merges.find(left.id, sym[static_cast<std::size_t>(left.next)].id); m != none) push(m, top.pos);
  }
  s.clear();
  for (std::int64_t k = 0; k >= 0; k = sym[static_cast<std::size_t>(k)].next)
    s.push_back(sym[static_cast<std::size_t>(k)].id);
}

DTRAIN_INLINE std::optional<std::uint32_t> BpeModel::model_id(std::string_view token) const {
  thread_local std::string bytes;
  std::string_view key = token;
  if (byte_level) {
    if (!bpe::token_bytes(token, bytes)) {
      const auto k = unspelled.find(token);
      return k == TokenTable::absent ? std::nullopt
                                     : std::optional<std::uint32_t>(unspelled_ids[static_cast<std::size_t>(k)]);
    }
    key = bytes;
  }
  const auto k = vocab.find(key);
  return k == TokenTable::absent ? std::nullopt : std::optional<std::uint32_t>(vocab_ids[static_cast<std::size_t>(k)]);
}

DTRAIN_INLINE std::optional<std::int64_t> BpeModel::token_to_id(std::string_view token) const {
  for (const auto& a : added)
    if (a.content == token) return a.id;
  if (const auto id = model_id(token)) return *id;
  return std::nullopt;
}

DTRAIN_INLINE std::string BpeModel::decode(std::span<const std::int64_t> ids, bool skip_special) const {
  std::vector<std::string> tokens;
  for (const auto id : ids) {
    if (id < 0 || id >= static_cast<std::int64_t>(id_tokens.size()) || !id_known[static_cast<std::size_t>(id)])
      continue;
    const auto& t = id_tokens[static_cast<std::size_t>(id)];
    if (skip_special && special_contents.find(t) != TokenTable::absent) continue;
    tokens.push_back(t);
  }
  const auto join = [](const std::vector<std::string>& v, std::string_view sep) {
    std::string out;
    for (std::size_t i = 0; i < v.size(); ++i) out.append(i ? sep : std::string_view()).append(v[i]);
    return out;
  };
  if (!decoders) return join(tokens, " ");
  for (const auto& d : *decoders) {
    switch (d.kind) {
      case Decode::byte_level: {
        std::string bytes, b;
        for (const auto& t : tokens) bytes += bpe::token_bytes(t, b) ? b : t;
        tokens.assign(1, bpe::utf8_lossy(bytes));
        break;
      }
      case Decode::fuse:
        tokens.assign(1, join(tokens, ""));
        break;
      case Decode::metaspace:
      case Decode::replace:
        for (std::size_t i = 0; i < tokens.size(); ++i) {
          const auto& from = d.text;
          if (from.empty()) continue;
          const auto by = d.kind == Decode::metaspace && i == 0 && d.prepend ? std::string() : d.by;
          std::string out;
          std::size_t at = 0;
          for (auto f = tokens[i].find(from); f != std::string::npos; f = tokens[i].find(from, at)) {
            out.append(tokens[i], at, f - at).append(by);
            at = f + from.size();
          }
          tokens[i] = out.append(tokens[i], at);
        }
        break;
      case Decode::byte_fallback: {
        std::vector<std::string> out;
        std::string run;
        std::size_t run_bytes = 0;
        const auto flush = [&] {
          if (!run_bytes) return;
          if (bpe::utf8_lossy(run) == run)
            out.push_back(run);
          else
            out.insert(out.end(), run_bytes, "\xEF\xBF\xBD");
          run.clear();
          run_bytes = 0;
        };
        const auto hex = [](char c) {
          return c >= '0' && c <= '9'   ? c - '0'
                 : c >= 'a' && c <= 'f' ? c - 'a' + 10
                 : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                        : -1;
        };
        for (auto& t : tokens) {
          // Rust's u8::from_str_radix(t[3..5], 16): two hex digits, or '+' and one.
          int value = -1;
          if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>') {
            const int hi = hex(t[3]), lo = hex(t[4]);
            if (hi >= 0 && lo >= 0)
              value = hi * 16 + lo;
            else if (t[3] == '+' && lo >= 0)
              value = lo;
          }
          if (value >= 0) {
            run.push_back(static_cast<char>(value));
            ++run_bytes;
            continue;
          }
          flush();
          out.push_back(std::move(t));
        }
        flush();
        tokens = std::move(out);
        break;
      }
      case Decode::strip:
        for (auto& t : tokens) {
          std::vector<std::pair<std::size_t, std::size_t>> chars;  // byte offset, length
          for (std::size_t i = 0; i < t.size();) {
            const auto c = bpe::char_at(t, i);
            chars.emplace_back(i, c.bytes);
            i += c.bytes;
          }
          const auto is = [&](std::size_t k) { return t.compare(chars[k].first, chars[k].second, d.text) == 0; };
          std::size_t begin = 0, end = chars.size();
          for (std::size_t k = 0; k < d.start && k < chars.size() && is(k); ++k) begin = k + 1;
          for (std::size_t k = 0; k < d.stop && k < chars.size() && is(chars.size() - k - 1); ++k)
            end = chars.size() - k - 1;
          const auto from = begin < chars.size() ? chars[begin].first : t.size();
          const auto to = end < chars.size() ? chars[end].first : t.size();
          t = from < to ? t.substr(from, to - from) : std::string();
        }
        break;
    }
  }
  return join(tokens, "");
}

}  // namespace data::detail
DTRAIN_NAMESPACE_END
