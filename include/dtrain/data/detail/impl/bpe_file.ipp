// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of bpe_file.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

#include <dtrain/data/detail/bpe_file.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace data::detail::bpe {

DTRAIN_INLINE void read_model(BpeModel& m, const json& model) {
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

DTRAIN_INLINE void read_added_tokens(BpeModel& m, const json& j) {
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

DTRAIN_INLINE void read_truncation_padding(BpeModel& m, const json& j) {
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

DTRAIN_INLINE void read_special_ids(BpeModel& m, const json& names) {
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

// The name of a special token in transformers' tokenizer_config.json: a string or {"content": ...}.
DTRAIN_INLINE std::optional<std::string> config_token(const json& config, const char* key) {
  if (!config.contains(key)) return std::nullopt;
  const auto& t = config[key];
  if (t.is_string()) return t.get<std::string>();
  if (t.is_object() && t.contains("content") && t["content"].is_string()) return t["content"].get<std::string>();
  return std::nullopt;
}

DTRAIN_INLINE nlohmann::json parse_file(const std::filesystem::path& path) {
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
}  // namespace data::detail::bpe
DTRAIN_NAMESPACE_END
