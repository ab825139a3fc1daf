// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of bpe_tokenizer.hpp's functions (docs/packaging.md: header-only or compiled once):
// reading a tokenizer.json into a detail::BpeModel, stage by stage, and the API around it.

#include <cctype>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

#include <dtrain/data/bpe_tokenizer.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace data {

namespace detail::bpe {
using json = nlohmann::json;

inline std::string type_of(const json& o) {
  const auto s = o.is_object() && o.contains("type") ? o["type"].dump() : o.dump();
  return s.size() > 80 ? s.substr(0, 80) + "..." : s;
}
// A Sequence's parts (tokenizers nests them under `key`), flattened.
inline void flatten(const json& o, const char* key, std::vector<const json*>& out) {
  if (o.is_null()) return;
  if (o.is_object() && o.value("type", "") == "Sequence") {
    for (const auto& p : o.at(key)) flatten(p, key, out);
    return;
  }
  out.push_back(&o);
}
inline std::optional<std::string> optional_string(const json& o, const char* key) {
  if (!o.contains(key) || o[key].is_null()) return std::nullopt;
  return o[key].get<std::string>();
}
// The name of a special token in transformers' tokenizer_config.json: a string or {"content": ...}.
inline std::optional<std::string> config_token(const json& config, const char* key) {
  if (!config.contains(key)) return std::nullopt;
  const auto& t = config[key];
  if (t.is_string()) return t.get<std::string>();
  if (t.is_object() && t.contains("content") && t["content"].is_string()) return t["content"].get<std::string>();
  return std::nullopt;
}

// A Split step: the three patterns BpeTokenizer has scanners for by them, any other by PCRE2.
inline Splitter read_split(const BpeModel& m, const json& p) {
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

inline void read_pre_tokenizer(BpeModel& m, const json& j) {
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

inline void read_model(BpeModel& m, const json& model) {
  if (auto d = model.value("dropout", json()); !d.is_null() && d.get<double>() != 0.0)
    m.fail("model.dropout " + d.dump() +
           " makes BPE random; BpeTokenizer reproduces deterministic BPE only (dropout null)");
  const auto& vocab = model.contains("vocab") ? model["vocab"] : json();
  if (!vocab.is_object() || vocab.empty()) m.fail("model.vocab is missing or empty");
  std::int64_t largest = -1;
  for (const auto& [token, id] : vocab.items()) {
    if (!id.is_number_integer() || id.get<std::int64_t>() < 0 || id.get<std::int64_t>() > 0x7FFFFFFF)
      m.fail("model.vocab[" + json(token).dump() + "] is " + id.dump() + ", not an id");
    largest = std::max(largest, id.get<std::int64_t>());
  }
  if (largest > 4 * static_cast<std::int64_t>(vocab.size()) + 4096)
    m.fail("model.vocab's ids are sparse (the largest is " + std::to_string(largest) + " for " +
           std::to_string(vocab.size()) + " tokens)");
  m.id_tokens.assign(static_cast<std::size_t>(largest) + 1, std::string());
  m.id_known.assign(m.id_tokens.size(), 0);
  std::string bytes;
  for (const auto& [token, id_json] : vocab.items()) {
    const auto id = id_json.get<std::uint32_t>();
    m.id_tokens[id] = token;
    m.id_known[id] = 1;
    auto* table = &m.vocab;
    auto* ids = &m.vocab_ids;
    std::string_view key = token;
    if (m.byte_level) {
      if (token_bytes(token, bytes))
        key = bytes;
      else
        table = &m.unspelled, ids = &m.unspelled_ids;
    }
    const auto k = static_cast<std::size_t>(table->intern(key));
    if (k == ids->size())
      ids->push_back(id);
    else
      (*ids)[k] = id;
  }
  m.prefix = optional_string(model, "continuing_subword_prefix").value_or("");
  m.suffix = optional_string(model, "end_of_word_suffix").value_or("");
  m.unk_token = optional_string(model, "unk_token");
  if (m.unk_token) m.unk_id = m.model_id(*m.unk_token);
  const auto flag = [&](const char* key) {
    return model.contains(key) && !model[key].is_null() && model[key].get<bool>();
  };
  m.fuse_unk = flag("fuse_unk");
  m.byte_fallback = flag("byte_fallback");
  m.ignore_merges = flag("ignore_merges");
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    const auto id = m.model_id(name);
    m.byte_fallback_ids[static_cast<std::size_t>(b)] = id ? static_cast<std::int64_t>(*id) : -1;
    if (!m.byte_level) continue;
    const auto& c = byte_chars()[static_cast<std::size_t>(b)];
    const std::string spelled[4] = {c, m.prefix + c, m.prefix + c + m.suffix,
                                    c + m.suffix};  // first, middle, last, only
    for (std::size_t where = 0; where < 4; ++where) {
      const auto u = m.model_id(spelled[where]);
      m.unit_ids[where][static_cast<std::size_t>(b)] = u ? static_cast<std::int64_t>(*u) : -1;
    }
  }

  // Merges by rank: "a b" strings (lines starting with #version skipped, as in merges.txt) or
  // [a, b] pairs; the merged token is a + b without b's continuing_subword_prefix.
  const auto& merges = model.contains("merges") ? model["merges"] : json();
  if (!merges.is_array()) m.fail("model.merges is missing or not a list");
  const bool strings = !merges.empty() && merges[0].is_string();
  std::uint32_t rank = 0;
  for (std::size_t i = 0; i < merges.size(); ++i) {
    const auto& e = merges[i];
    const auto where =
        "model.merges[" + std::to_string(i) + "] " + (e.dump().size() > 80 ? e.dump().substr(0, 80) + "..." : e.dump());
    std::string a, b;
    if (strings && e.is_string()) {
      const auto& s = e.get_ref<const std::string&>();
      if (s.rfind("#version", 0) == 0) continue;
      const auto space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
        m.fail(where + " is not two tokens separated by one space");
      a = s.substr(0, space);
      b = s.substr(space + 1);
    } else if (!strings && e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    } else {
      m.fail(where + " is not a merge like the others: every merge is \"a b\", or every merge is [\"a\", \"b\"]");
    }
    const auto left = m.model_id(a), right = m.model_id(b);
    if (!left || !right) m.fail(where + " names " + json(left ? b : a).dump() + ", which model.vocab lacks");
    if (b.size() < m.prefix.size())
      m.fail(where + ": " + json(b).dump() + " is shorter than continuing_subword_prefix");
    const auto merged = a + b.substr(m.prefix.size());
    const auto id = m.model_id(merged);
    if (!id) m.fail(where + " makes " + json(merged).dump() + ", which model.vocab lacks");
    m.merges.put(*left, *right, rank++, *id);
  }
}

inline void read_normalizer(BpeModel& m, const json& j) {
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

inline void read_added_tokens(BpeModel& m, const json& j) {
  // tokenizers' AddedVocabulary::add_tokens, in the file's order: a token's id is its id among the
  // added tokens before it, else the model's, else the next id after the model's vocabulary (the
  // file's "id" only makes tokenizers warn when it differs).
  std::map<std::string, std::uint32_t> by_content;
  std::map<std::uint32_t, BpeModel::Added> by_id;
  std::vector<std::string> specials;
  auto next_id = static_cast<std::uint32_t>(j["model"]["vocab"].size());
  for (const auto& t : j.value("added_tokens", json::array())) {
    BpeModel::Added a;
    a.content = t.at("content").get<std::string>();
    a.single_word = t.value("single_word", false);
    a.lstrip = t.value("lstrip", false);
    a.rstrip = t.value("rstrip", false);
    a.normalized = t.value("normalized", true);
    a.special = t.value("special", false);
    if (a.content.empty()) continue;
    const auto same = [&](const BpeModel::Added& b) {
      return b.content == a.content && b.single_word == a.single_word && b.lstrip == a.lstrip && b.rstrip == a.rstrip &&
             b.normalized == a.normalized && b.special == a.special;
    };
    if (auto it = by_content.find(a.content);
        it != by_content.end() && by_id.count(it->second) && same(by_id[it->second]))
      continue;
    if (auto it = by_content.find(a.content); it != by_content.end())
      a.id = it->second;
    else if (auto id = m.model_id(a.content))
      a.id = *id;
    else
      a.id = next_id++;
    if (a.normalized && !m.normalizers.empty())
      m.normalize(a.content, a.decoded);
    else
      a.decoded = a.content;
    by_content[a.content] = a.id;
    if (a.special) specials.push_back(a.content);
    by_id[a.id] = a;
  }
  for (auto& [id, a] : by_id) {
    if (id >= m.id_tokens.size()) {
      m.id_tokens.resize(id + 1);
      m.id_known.resize(id + 1, 0);
    }
    m.id_tokens[id] = a.decoded;
    m.id_known[id] = 2;
    const auto index = static_cast<std::uint32_t>(m.added.size());
    if (a.normalized)
      m.normalized_trie.add(a.decoded, index);
    else
      m.raw_trie.add(a.content, index);
    m.added.push_back(std::move(a));
  }
  for (const auto& s : specials) m.special_contents.intern(s);
}

inline void read_post_processor(BpeModel& m, const json& j) {
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

inline void read_decoder(BpeModel& m, const json& j) {
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

inline void read_truncation_padding(BpeModel& m, const json& j) {
  if (const auto t = j.value("truncation", json()); !t.is_null()) {
    m.max_length = t.at("max_length").get<std::int64_t>();
    if (*m.max_length < 0) m.fail("truncation max_length " + std::to_string(*m.max_length) + " is negative");
    m.truncate_left = t.value("direction", "Right") == "Left";
    const auto strategy = t.value("strategy", "LongestFirst");
    if (strategy == "OnlySecond")
      m.fail("truncation strategy OnlySecond needs a pair of texts; BpeTokenizer encodes single texts");
    if (strategy != "LongestFirst" && strategy != "OnlyFirst")
      m.fail("truncation strategy " + strategy + " is unknown");
    const auto special = static_cast<std::int64_t>(m.begin_ids.size() + m.end_ids.size());
    if (*m.max_length < special)
      m.fail("truncation max_length " + std::to_string(*m.max_length) + " is shorter than the " +
             std::to_string(special) + " special tokens the post-processor adds");
  }
  if (const auto p = j.value("padding", json()); !p.is_null()) {
    m.padding = true;
    if (p.at("strategy").is_object())
      m.pad_fixed = p["strategy"].at("Fixed").get<std::int64_t>();
    else if (p["strategy"] != "BatchLongest")
      m.fail("padding strategy " + p["strategy"].dump() + " is unknown");
    m.pad_left = p.value("direction", "Right") == "Left";
    m.pad_id = p.value("pad_id", std::int64_t{0});
    if (p.contains("pad_to_multiple_of") && !p["pad_to_multiple_of"].is_null())
      m.pad_to_multiple_of = p["pad_to_multiple_of"].get<std::int64_t>();
  }
}

inline void read_special_ids(BpeModel& m, const json& names) {
  const auto named = [&](const char* key) -> std::optional<std::int64_t> {
    if (!names.contains(key) || !names[key].is_string()) return std::nullopt;
    const auto token = names[key].get<std::string>();
    const auto id = m.token_to_id(token);
    if (!id)
      m.fail(std::string(key) + " " + token + " (tokenizer_config.json or with_eos) is not a token of this tokenizer");
    return id;
  };
  const auto added_named = [&](std::initializer_list<std::string_view> list) -> std::optional<std::int64_t> {
    for (const auto name : list)
      for (const auto& a : m.added)
        if (a.content == name) return a.id;
    return std::nullopt;
  };
  m.bos_id = named("bos_token");
  if (!m.bos_id && !m.begin_ids.empty()) m.bos_id = m.begin_ids.front();
  if (!m.bos_id) m.bos_id = added_named({"<|begin_of_text|>", "<s>", "<bos>", "<|startoftext|>"});
  m.eos_id = named("eos_token");
  if (!m.eos_id && !m.end_ids.empty()) m.eos_id = m.end_ids.back();
  if (!m.eos_id)
    m.eos_id = added_named({"</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>", "<|eot_id|>", "<|im_end|>"});
  if (!m.padding) {
    auto pad = named("pad_token");
    if (!pad) pad = added_named({"<pad>", "<|pad|>", "[PAD]"});
    m.pad_id = pad.value_or(m.eos_id.value_or(0));
  }
}
}  // namespace detail::bpe

DTRAIN_INLINE BpeTokenizer BpeTokenizer::build(nlohmann::json j, nlohmann::json names, const std::string& origin) {
  auto m = std::make_shared<detail::BpeModel>();
  m->origin = origin;
  try {
    if (!j.is_object()) m->fail("not a tokenizer.json (the top level is not an object)");
    const auto& model = j.contains("model") ? j["model"] : nlohmann::json();
    if (!model.is_object() || model.value("type", "") != "BPE")
      m->fail("the model is " + detail::bpe::type_of(model) +
              ", not BPE; BpeTokenizer reads BPE tokenizers (GPT-2, Llama, Qwen2, Mistral), WordPieceTokenizer BERT's");
    // The pre-tokenizer first: whether words are bytes decides how the vocabulary is kept.
    detail::bpe::read_pre_tokenizer(*m, j);
    detail::bpe::read_model(*m, model);
    detail::bpe::read_normalizer(*m, j);
    detail::bpe::read_added_tokens(*m, j);
    detail::bpe::read_post_processor(*m, j);
    detail::bpe::read_decoder(*m, j);
    detail::bpe::read_truncation_padding(*m, j);
    detail::bpe::read_special_ids(*m, names);
  } catch (const nlohmann::json::exception& e) {
    m->fail(std::string("unexpected content: ") + e.what());
  }
  m->source = std::move(j);
  BpeTokenizer t;
  t.model_ = std::move(m);
  t.names_ = std::move(names);
  return t;
}

namespace detail::bpe {
inline nlohmann::json parse_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError("BpeTokenizer: cannot read " + path.string() + " (no such file, or unreadable)");
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    throw DataError("BpeTokenizer: " + path.string() + " is not JSON: " + e.what());
  }
}
}  // namespace detail::bpe

DTRAIN_INLINE BpeTokenizer BpeTokenizer::from_file(const std::filesystem::path& tokenizer_json) {
  return build(detail::bpe::parse_file(tokenizer_json), nlohmann::json::object(), tokenizer_json.string());
}

DTRAIN_INLINE BpeTokenizer BpeTokenizer::from_directory(const std::filesystem::path& dir) {
  const auto file = dir / "tokenizer.json";
  if (!std::filesystem::exists(file))
    throw DataError("BpeTokenizer: " + dir.string() + " has no tokenizer.json" +
                    (std::filesystem::exists(dir / "merges.txt")
                         ? " (vocab.json and merges.txt alone are not read: save the tokenizer with transformers' "
                           "save_pretrained, which writes tokenizer.json)"
                         : ""));
  auto names = nlohmann::json::object();
  if (const auto config = dir / "tokenizer_config.json"; std::filesystem::exists(config)) {
    const auto c = detail::bpe::parse_file(config);
    for (const char* key : {"bos_token", "eos_token", "pad_token"})
      if (const auto name = detail::bpe::config_token(c, key)) names[key] = *name;
  }
  return build(detail::bpe::parse_file(file), std::move(names), file.string());
}

DTRAIN_INLINE BpeTokenizer BpeTokenizer::from_json(nlohmann::json j, const std::string& origin) {
  return build(std::move(j), nlohmann::json::object(), origin);
}

DTRAIN_INLINE std::vector<std::int64_t> BpeTokenizer::encode(std::string_view text, bool add_special_tokens) const {
  std::vector<std::int64_t> ids;
  model().encode(text, add_special_tokens, ids);
  return ids;
}

DTRAIN_INLINE BpeEncoding BpeTokenizer::encoding(std::string_view text, bool add_special_tokens) const {
  BpeEncoding e;
  model().encode(text, add_special_tokens, e.input_ids);
  e.attention_mask.assign(e.input_ids.size(), 1);
  return pad(std::move(e));
}

DTRAIN_INLINE BpeEncoding BpeTokenizer::pad(BpeEncoding e, std::int64_t to) const {
  const auto& m = model();
  if (!m.padding) return e;
  auto target = m.pad_fixed.value_or(std::max<std::int64_t>(to, static_cast<std::int64_t>(e.input_ids.size())));
  if (m.pad_to_multiple_of > 0 && target % m.pad_to_multiple_of != 0)
    target += m.pad_to_multiple_of - target % m.pad_to_multiple_of;
  const auto have = static_cast<std::int64_t>(e.input_ids.size());
  if (have >= target) return e;
  const auto n = static_cast<std::size_t>(target - have);
  e.input_ids.insert(m.pad_left ? e.input_ids.begin() : e.input_ids.end(), n, m.pad_id);
  e.attention_mask.insert(m.pad_left ? e.attention_mask.begin() : e.attention_mask.end(), n, 0);
  return e;
}

DTRAIN_INLINE std::string BpeTokenizer::decode(const torch::Tensor& ids, bool skip_special_tokens) const {
  if (ids.dim() > 1 || ids.is_floating_point() || ids.is_complex())
    throw DataError("BpeTokenizer::decode: ids of shape " + std::to_string(ids.dim()) +
                    "-D and an integer dtype are one sequence; give a 1-D integer tensor (a row of a batch: ids[i])");
  const auto flat = ids.reshape({-1}).to(torch::kCPU, torch::kInt64).contiguous();
  return decode(std::span<const std::int64_t>(flat.data_ptr<std::int64_t>(), static_cast<std::size_t>(flat.numel())),
                skip_special_tokens);
}

DTRAIN_INLINE std::optional<std::string> BpeTokenizer::id_to_token(std::int64_t id) const {
  const auto& m = model();
  if (id < 0 || id >= size() || !m.id_known[static_cast<std::size_t>(id)]) return std::nullopt;
  return m.id_tokens[static_cast<std::size_t>(id)];
}

DTRAIN_INLINE BpeTokenizer BpeTokenizer::with_max_length(std::int64_t n, Side side) const {
  const auto& m = model();
  const auto special = static_cast<std::int64_t>(m.begin_ids.size() + m.end_ids.size());
  if (n < 0)
    throw DataError("BpeTokenizer::with_max_length: " + std::to_string(n) + " is negative; give 0 for no truncation");
  if (n > 0 && n < special)
    throw DataError("BpeTokenizer::with_max_length: " + std::to_string(n) + " is shorter than the " +
                    std::to_string(special) + " special tokens encode() adds; give " + std::to_string(special) +
                    " or more, or 0 for no truncation");
  auto j = json();
  if (n == 0) {
    j["truncation"] = nullptr;
  } else {
    const auto& old = j["truncation"];
    j["truncation"] = {{"direction", side == Side::left ? "Left" : "Right"},
                       {"max_length", n},
                       {"strategy", old.is_object() ? old.value("strategy", "LongestFirst") : "LongestFirst"},
                       {"stride", 0}};
  }
  return build(std::move(j), names_, m.origin + " (truncated to " + std::to_string(n) + ")");
}

DTRAIN_INLINE BpeTokenizer BpeTokenizer::with_padding(Side side) const {
  auto j = json();
  auto p = j["padding"].is_object() ? j["padding"]
                                    : nlohmann::json{{"strategy", "BatchLongest"},
                                                     {"pad_to_multiple_of", nullptr},
                                                     {"pad_id", pad_id()},
                                                     {"pad_type_id", 0},
                                                     {"pad_token", id_to_token(pad_id()).value_or("")}};
  p["direction"] = side == Side::left ? "Left" : "Right";
  j["padding"] = std::move(p);
  return build(std::move(j), names_, model().origin);
}

DTRAIN_INLINE BpeTokenizer BpeTokenizer::without_padding() const {
  auto j = json();
  j["padding"] = nullptr;
  return build(std::move(j), names_, model().origin);
}

DTRAIN_INLINE BpeTokenizer BpeTokenizer::with_eos(std::string_view token) const {
  if (!token_to_id(token))
    throw DataError("BpeTokenizer::with_eos: " + std::string(token) + " is not a token of " + model().origin +
                    " (an added token's content, or a vocabulary entry as the file writes it)");
  auto names = names_;
  names["eos_token"] = std::string(token);
  return build(json(), std::move(names), model().origin);
}

DTRAIN_INLINE void BpeTokenizer::save(torch::serialize::OutputArchive& a) const {
  detail::write_json(a, "BpeTokenizer", json());
  a.write("special_tokens", c10::IValue(names_.dump()));
}

DTRAIN_INLINE void BpeTokenizer::load(torch::serialize::InputArchive& a) {
  auto j = detail::read_json(a, "BpeTokenizer");
  c10::IValue names;
  auto parsed = nlohmann::json::object();
  if (a.try_read("special_tokens", names) && names.isString()) parsed = nlohmann::json::parse(names.toStringRef());
  *this = build(std::move(j), std::move(parsed), "the checkpoint's BpeTokenizer");
}

}  // namespace data
DTRAIN_NAMESPACE_END
