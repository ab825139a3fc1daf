// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of bpe_stages.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <cctype>

#include <dtrain/data/detail/bpe_stages.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace data::detail::bpe {

DTRAIN_INLINE std::string type_of(const json& o) {
  const auto s = o.is_object() && o.contains("type") ? o["type"].dump() : o.dump();
  return s.size() > 80 ? s.substr(0, 80) + "..." : s;
}
// A Sequence's parts (tokenizers nests them under `key`), flattened.
DTRAIN_INLINE void flatten(const json& o, const char* key, std::vector<const json*>& out) {
  if (o.is_null()) return;
  if (o.is_object() && o.value("type", "") == "Sequence") {
    for (const auto& p : o.at(key)) flatten(p, key, out);
    return;
  }
  out.push_back(&o);
}
DTRAIN_INLINE std::optional<std::string> optional_string(const json& o, const char* key) {
  if (!o.contains(key) || o[key].is_null()) return std::nullopt;
  return o[key].get<std::string>();
}
// A Split step: the three patterns BpeTokenizer has scanners for by them, any other by PCRE2.
DTRAIN_INLINE Splitter read_split(const BpeModel& m, const json& p) {
  Splitter s;
  const auto& pattern = p.at("pattern");
  std::string re;
  if (pattern.contains("String")) {  // a literal: a Regex with its ASCII punctuation escaped
    for (const char c : pattern["String"].get<std::string>()) {
      if (static_cast<unsigned char>(c) < 0x80 && !std::isalnum(static_cast<unsigned char>(c))) re.push_back('\\');
      re.push_back(c);
    }
  } else {
    re = pattern.at("Regex").get<std::string>();
    s.scanner = re == kGpt2Pattern     ? std::optional(Pattern::gpt2)
                : re == kLlama3Pattern ? std::optional(Pattern::llama3)
                : re == kQwen2Pattern  ? std::optional(Pattern::qwen2)
                                       : std::nullopt;
  }
  if (!s.scanner) {
    try {
      s.regex = std::make_shared<const Regex>(re);
    } catch (const DataError& e) {
      m.fail(std::string("pre_tokenizer Split: ") + e.what());
    }
  }
  const auto behavior = p.value("behavior", "");
  const bool invert = p.value("invert", false);
  if (behavior == "Isolated")
    s.keep = Splitter::all;
  else if (behavior == "Removed")
    s.keep = invert ? Splitter::matches : Splitter::gaps;
  else
    m.fail("pre_tokenizer Split with behavior " + p.value("behavior", json()).dump() +
           " is not supported (Isolated, or Removed)");
  return s;
}

DTRAIN_INLINE void read_pre_tokenizer(BpeModel& m, const json& j) {
  std::vector<const json*> steps;
  const auto root = j.value("pre_tokenizer", json());  // steps point into it
  flatten(root, "pretokenizers", steps);
  for (const auto* step : steps) {
    const auto& p = *step;
    const auto type = p.value("type", "");
    if (type == "Split") {
      if (m.byte_level_step) m.fail("pre_tokenizer: a Split after ByteLevel is not supported (ByteLevel comes last)");
      m.splits.push_back(read_split(m, p));
    } else if (type == "ByteLevel") {
      if (m.byte_level_step) m.fail("pre_tokenizer has two ByteLevel steps");
      m.byte_level_step = true;
      m.add_prefix_space = p.value("add_prefix_space", true);
      m.byte_level_regex = p.value("use_regex", true);
    } else if (type == "Metaspace") {
      if (steps.size() != 1) m.fail("pre_tokenizer: Metaspace in a Sequence is not supported (alone, or null)");
      BpeModel::Metaspace ms;
      ms.replacement = p.at("replacement").get<std::string>();
      const auto scheme = p.value("prepend_scheme", "always");
      ms.prepend = scheme == "first"   ? BpeModel::Metaspace::first
                   : scheme == "never" ? BpeModel::Metaspace::never
                                       : BpeModel::Metaspace::always;
      if (scheme != "always" && scheme != "first" && scheme != "never")
        m.fail("Metaspace prepend_scheme " + scheme + " is unknown");
      if (p.contains("add_prefix_space") && p["add_prefix_space"].is_boolean() && !p["add_prefix_space"].get<bool>()) {
        if (ms.prepend != BpeModel::Metaspace::never)
          m.fail("Metaspace: add_prefix_space false with prepend_scheme " + scheme);
        ms.prepend = BpeModel::Metaspace::never;
      }
      ms.split = !p.contains("split") || p["split"].is_null() || p["split"].get<bool>();
      m.metaspace = ms;
    } else {
      m.fail("pre_tokenizer " + type_of(p) +
             " is not supported (ByteLevel, Split, Metaspace, a Sequence of them, or null)");
    }
  }
  m.byte_level = m.byte_level_step;
}

DTRAIN_INLINE void read_normalizer(BpeModel& m, const json& j) {
  std::vector<const json*> steps;
  const auto root = j.value("normalizer", json());  // steps point into it
  flatten(root, "normalizers", steps);
  for (const auto* step : steps) {
    const auto& n = *step;
    const auto type = n.value("type", "");
    if (type == "NFC") {
      m.normalizers.push_back({BpeModel::Normalize::nfc, {}, {}});
    } else if (type == "Prepend") {
      m.normalizers.push_back({BpeModel::Normalize::prepend, n.at("prepend").get<std::string>(), {}});
    } else if (type == "Lowercase") {
      m.normalizers.push_back({BpeModel::Normalize::lowercase, {}, {}});
    } else if (type == "Replace" && n.at("pattern").contains("String")) {
      m.normalizers.push_back({BpeModel::Normalize::replace, n["pattern"]["String"].get<std::string>(),
                               n.at("content").get<std::string>()});
    } else if (type == "Replace" && n["pattern"].contains("Regex")) {
      BpeModel::Normalize r{BpeModel::Normalize::replace, {}, n.at("content").get<std::string>()};
      try {
        r.pattern = std::make_shared<const Regex>(n["pattern"]["Regex"].get<std::string>());
      } catch (const DataError& e) {
        m.fail(std::string("normalizer Replace: ") + e.what());
      }
      m.normalizers.push_back(std::move(r));
    } else {
      m.fail("normalizer " + type_of(n) +
             " is not supported (NFC, Lowercase, Prepend, Replace, a Sequence of them, or null)");
    }
  }
}

DTRAIN_INLINE void read_post_processor(BpeModel& m, const json& j) {
  std::vector<const json*> steps;
  const auto root = j.value("post_processor", json());  // steps point into it
  flatten(root, "processors", steps);
  int adding = 0;
  const auto id_of = [&](const json& v) {
    const auto id = v.get<std::int64_t>();
    if (id < 0 || id > 0x7FFFFFFF) m.fail("post_processor: " + v.dump() + " is not an id");
    return static_cast<std::uint32_t>(id);
  };
  for (const auto* step : steps) {
    const auto& p = *step;
    const auto type = p.value("type", "");
    if (type == "ByteLevel") continue;  // offsets only
    ++adding;
    if (type == "TemplateProcessing") {
      bool text = false;
      for (const auto& piece : p.at("single")) {
        if (piece.contains("Sequence")) {
          if (text || piece["Sequence"].at("id").get<std::string>() != "A")
            m.fail("post_processor's single template " + p["single"].dump() + " is not special tokens around $A");
          text = true;
          continue;
        }
        const auto name = piece.at("SpecialToken").at("id").get<std::string>();
        if (!p.at("special_tokens").contains(name))
          m.fail("post_processor's template names " + name + ", which its special_tokens lack");
        for (const auto& id : p["special_tokens"][name].at("ids"))
          (text ? m.end_ids : m.begin_ids).push_back(id_of(id));
      }
      if (!text) m.fail("post_processor's single template " + p["single"].dump() + " has no $A");
    } else if (type == "RobertaProcessing" || type == "BertProcessing") {
      m.begin_ids = {id_of(p.at("cls").at(1))};
      m.end_ids = {id_of(p.at("sep").at(1))};
    } else {
      m.fail("post_processor " + type_of(p) +
             " is not supported (TemplateProcessing, RobertaProcessing, BertProcessing, ByteLevel, a Sequence of them, "
             "or null)");
    }
  }
  if (adding > 1)
    m.fail("post_processor: a Sequence with more than one processor that adds special tokens is not supported");
}

DTRAIN_INLINE void read_decoder(BpeModel& m, const json& j) {
  const auto d = j.value("decoder", json());  // steps point into it
  if (d.is_null()) return;
  std::vector<const json*> steps;
  flatten(d, "decoders", steps);
  m.decoders.emplace();
  for (const auto* step : steps) {
    const auto& p = *step;
    const auto type = p.value("type", "");
    BpeModel::Decode s{};
    if (type == "ByteLevel") {
      s.kind = BpeModel::Decode::byte_level;
    } else if (type == "Metaspace") {
      s.kind = BpeModel::Decode::metaspace;
      s.text = p.at("replacement").get<std::string>();
      s.by = " ";
      s.prepend =
          p.value("prepend_scheme", "always") != "never" &&
          !(p.contains("add_prefix_space") && p["add_prefix_space"].is_boolean() && !p["add_prefix_space"].get<bool>());
    } else if (type == "Replace" && p.at("pattern").contains("String")) {
      s.kind = BpeModel::Decode::replace;
      s.text = p["pattern"]["String"].get<std::string>();
      s.by = p.at("content").get<std::string>();
    } else if (type == "ByteFallback") {
      s.kind = BpeModel::Decode::byte_fallback;
    } else if (type == "Fuse") {
      s.kind = BpeModel::Decode::fuse;
    } else if (type == "Strip") {
      s.kind = BpeModel::Decode::strip;
      s.text = p.at("content").get<std::string>();
      s.start = p.value("start", std::size_t{0});
      s.stop = p.value("stop", std::size_t{0});
    } else {
      m.fail("decoder " + (type == "Replace" ? "Replace of the pattern " + p["pattern"].dump() : type_of(p)) +
             " is not supported (ByteLevel, Metaspace, Replace of a string, ByteFallback, Fuse, Strip, a Sequence of "
             "them, or null)");
    }
    m.decoders->push_back(std::move(s));
  }
}

}  // namespace data::detail::bpe
DTRAIN_NAMESPACE_END
