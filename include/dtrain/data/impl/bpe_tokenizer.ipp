// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of bpe_tokenizer.hpp's functions (docs/packaging.md: header-only or compiled once):
// the API around a detail::BpeModel, which bpe_file.hpp and bpe_stages.hpp read.

#include <dtrain/data/bpe_tokenizer.hpp>
#include <dtrain/data/detail/bpe_file.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace data {

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
