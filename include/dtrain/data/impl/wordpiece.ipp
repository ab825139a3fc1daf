// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of wordpiece.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/data/wordpiece.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace data {

DTRAIN_INLINE WordPieceTokenizer WordPieceTokenizer::from_directory(const std::filesystem::path& dir, const Options& options) {
  if (std::filesystem::exists(dir / "tokenizer.json")) return from_file(dir / "tokenizer.json");
  if (std::filesystem::exists(dir / "vocab.txt")) return from_vocab(dir / "vocab.txt", options);
  throw DataError("WordPieceTokenizer: " + dir.string() + " has neither tokenizer.json nor vocab.txt");
}

DTRAIN_INLINE WordPieceTokenizer WordPieceTokenizer::from_vocab(const std::filesystem::path& vocab_txt, const Options& o) {
  std::ifstream in(vocab_txt, std::ios::binary);
  if (!in) throw DataError("WordPieceTokenizer: cannot read " + vocab_txt.string());
  nlohmann::json vocab = nlohmann::json::object();
  std::string line;
  for (std::int64_t id = 0; std::getline(in, line); ++id) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    vocab.emplace(line, id);  // a repeated piece keeps its first id
  }
  const auto special = [&](const std::string& t) -> std::optional<std::int64_t> {
    if (auto it = vocab.find(t); it != vocab.end()) return it->get<std::int64_t>();
    return std::nullopt;
  };
  const auto cls = special(o.cls_token), sep = special(o.sep_token);
  if (!cls || !sep)
    throw DataError("WordPieceTokenizer: " + vocab_txt.string() + " has no " + (cls ? o.sep_token : o.cls_token) +
                    "; pass its special tokens' names in Options");
  nlohmann::json j;
  j["added_tokens"] = nlohmann::json::array();
  for (const auto* t : {&o.pad_token, &o.unk_token, &o.cls_token, &o.sep_token, &o.mask_token})
    if (auto id = special(*t)) j["added_tokens"].push_back({{"id", *id}, {"content", *t}, {"normalized", false}});
  j["normalizer"] = {{"type", "BertNormalizer"},         {"clean_text", o.clean_text},
                     {"handle_chinese_chars", o.handle_chinese_chars},
                     {"strip_accents", o.strip_accents ? nlohmann::json(*o.strip_accents) : nlohmann::json()},
                     {"lowercase", o.lowercase}};
  j["pre_tokenizer"] = {{"type", "BertPreTokenizer"}};
  j["model"] = {{"type", "WordPiece"},
                {"unk_token", o.unk_token},
                {"continuing_subword_prefix", o.continuing_subword_prefix},
                {"max_input_chars_per_word", o.max_input_chars_per_word},
                {"vocab", std::move(vocab)}};  // the lookups above are done
  j["post_processor"] = {{"type", "BertProcessing"}, {"cls", {o.cls_token, *cls}}, {"sep", {o.sep_token, *sep}}};
  j["truncation"] = o.max_length > 0 ? nlohmann::json{{"max_length", o.max_length}, {"strategy", "LongestFirst"}}
                                     : nlohmann::json();
  j["padding"] = nullptr;  // as BertWordPieceTokenizer: pad_id() is [PAD]'s all the same
  return from_json(std::move(j), vocab_txt.string());
}

DTRAIN_INLINE WordPieceTokenizer WordPieceTokenizer::with_max_length(std::int64_t n) const {
  if (n < 0) throw DataError("WordPieceTokenizer::with_max_length: " + std::to_string(n) + " is negative; give 0 for no truncation");
  if (n == 1)
    throw DataError("WordPieceTokenizer::with_max_length: " + std::to_string(n) +
                    " is shorter than [CLS] and [SEP] together; give 2 or more, or 0 for no truncation");
  auto j = json();
  if (n == 0) {
    j["truncation"] = nullptr;
  } else {
    auto t = j["truncation"].is_object() ? j["truncation"] : nlohmann::json{{"direction", "Right"}, {"strategy", "LongestFirst"}, {"stride", 0}};
    t["max_length"] = n;
    j["truncation"] = std::move(t);
  }
  return from_json(std::move(j), "the tokenizer truncated to " + std::to_string(n));
}

DTRAIN_INLINE nlohmann::json WordPieceTokenizer::parse_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError("WordPieceTokenizer: cannot read " + path.string() + " (no such file, or unreadable)");
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    throw DataError("WordPieceTokenizer: " + path.string() + " is not JSON: " + e.what());
  }
}
}  // namespace data
DTRAIN_NAMESPACE_END
