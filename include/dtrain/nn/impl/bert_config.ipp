// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of bert_config.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/nn/bert_config.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace nn {

DTRAIN_INLINE BertConfig& BertConfig::with_num_labels(std::int64_t n) {
  id2label.clear();
  for (std::int64_t i = 0; i < n; ++i) id2label.push_back("LABEL_" + std::to_string(i));
  return *this;
}

namespace detail {

DTRAIN_INLINE const std::set<std::string>& bert_volatile_keys() {
  static const std::set<std::string> keys = {"_name_or_path", "architectures", "transformers_version", "model_type",
                                             "num_labels", "label2id", "torch_dtype", "dtype"};
  return keys;
}
}  // namespace detail

DTRAIN_INLINE BertConfig BertConfig::from_json(const nlohmann::json& j, const std::string& source) {
  if (!j.is_object()) throw ConfigError(source + ": a BERT config must be a JSON object, got " + std::string(j.type_name()));
  const auto fail = [&](const std::string& what) { return ConfigError(source + ": " + what); };
  if (j.contains("model_type") && j["model_type"] != "bert")
    throw fail("model_type " + j["model_type"].dump() +
               " is not supported by nn::BertModel (only \"bert\": BERT, MiniLM and other models saved as BertModel)");
  BertConfig c;
  std::set<std::string> used;
  const auto take = [&](const char* key, auto& field) {
    used.insert(key);
    if (!j.contains(key)) return;
    try {
      j.at(key).get_to(field);
    } catch (const nlohmann::json::exception& e) {
      throw fail(std::string("\"") + key + "\" is " + j.at(key).dump() + ", which is not a " +
                 (std::is_same_v<std::decay_t<decltype(field)>, std::string> ? "string" : "number") + " (" + e.what() + ")");
    }
  };
  take("vocab_size", c.vocab_size);
  take("hidden_size", c.hidden_size);
  take("num_hidden_layers", c.num_hidden_layers);
  take("num_attention_heads", c.num_attention_heads);
  take("intermediate_size", c.intermediate_size);
  take("hidden_act", c.hidden_act);
  take("hidden_dropout_prob", c.hidden_dropout_prob);
  take("attention_probs_dropout_prob", c.attention_probs_dropout_prob);
  take("max_position_embeddings", c.max_position_embeddings);
  take("type_vocab_size", c.type_vocab_size);
  take("layer_norm_eps", c.layer_norm_eps);
  take("initializer_range", c.initializer_range);
  for (const char* key : {"pad_token_id", "classifier_dropout"}) {
    used.insert(key);
    if (!j.contains(key) || j[key].is_null()) {
      if (std::string(key) == "pad_token_id" && j.contains(key)) c.pad_token_id.reset();
      continue;
    }
    if (!j[key].is_number()) throw fail(std::string("\"") + key + "\" is " + j[key].dump() + ", not a number or null");
    if (std::string(key) == "pad_token_id") c.pad_token_id = j[key].get<std::int64_t>();
    else c.classifier_dropout = j[key].get<double>();
  }

  // Settings that change what the model computes, and that this implementation does not compute.
  const auto refuse = [&](const char* key, const nlohmann::json& supported, const std::string& what) {
    used.insert(key);
    if (j.contains(key) && j[key] != supported)
      throw fail(std::string("\"") + key + "\": " + j[key].dump() + " is not supported (" + what + ")");
  };
  refuse("position_embedding_type", "absolute", "nn::BertModel has absolute position embeddings only");
  refuse("is_decoder", false, "nn::BertModel is an encoder: no causal mask, no cache");
  refuse("add_cross_attention", false, "nn::BertModel has no cross-attention");
  refuse("embedding_size", j.value("hidden_size", c.hidden_size),
         "embeddings as wide as hidden_size only; a factorised embedding is ALBERT's");
  if (c.hidden_act != "gelu" && c.hidden_act != "gelu_new" && c.hidden_act != "gelu_pytorch_tanh" &&
      c.hidden_act != "relu")
    throw fail("\"hidden_act\": \"" + c.hidden_act +
               "\" is not supported (nn::BertModel computes gelu, gelu_new, gelu_pytorch_tanh and relu)");

  for (const auto& [name, value] : {std::pair{"vocab_size", c.vocab_size}, {"hidden_size", c.hidden_size},
                                    {"num_hidden_layers", c.num_hidden_layers}, {"num_attention_heads", c.num_attention_heads},
                                    {"intermediate_size", c.intermediate_size},
                                    {"max_position_embeddings", c.max_position_embeddings},
                                    {"type_vocab_size", c.type_vocab_size}})
    if (value < (std::string(name) == "num_hidden_layers" ? 0 : 1))
      throw fail(std::string("\"") + name + "\" is " + std::to_string(value) + "; it must be positive");
  if (c.hidden_size % c.num_attention_heads != 0)
    throw fail("\"hidden_size\" " + std::to_string(c.hidden_size) + " is not a multiple of \"num_attention_heads\" " +
               std::to_string(c.num_attention_heads));
  if (c.pad_token_id && (*c.pad_token_id < 0 || *c.pad_token_id >= c.vocab_size))
    throw fail("\"pad_token_id\" " + std::to_string(*c.pad_token_id) + " is outside the vocabulary of " +
               std::to_string(c.vocab_size));

  // Labels: id2label ({"0": "neg", ...}, ids 0..n-1), else num_labels, else transformers' 2.
  used.insert("id2label");
  c.id2label = detail::read_hub_labels(j, c.id2label, fail);

  for (const auto& [key, value] : j.items())
    if (!used.count(key) && !detail::bert_volatile_keys().count(key)) c.extra[key] = value;
  return c;
}

DTRAIN_INLINE nlohmann::json BertConfig::to_json() const {
  nlohmann::json j = extra.is_object() ? extra : nlohmann::json::object();
  j["model_type"] = "bert";
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = hidden_size;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_attention_heads"] = num_attention_heads;
  j["intermediate_size"] = intermediate_size;
  j["hidden_act"] = hidden_act;
  j["hidden_dropout_prob"] = hidden_dropout_prob;
  j["attention_probs_dropout_prob"] = attention_probs_dropout_prob;
  j["max_position_embeddings"] = max_position_embeddings;
  j["type_vocab_size"] = type_vocab_size;
  j["layer_norm_eps"] = layer_norm_eps;
  j["pad_token_id"] = pad_token_id ? nlohmann::json(*pad_token_id) : nlohmann::json(nullptr);
  j["initializer_range"] = initializer_range;
  j["classifier_dropout"] = classifier_dropout ? nlohmann::json(*classifier_dropout) : nlohmann::json(nullptr);
  j["position_embedding_type"] = "absolute";
  detail::write_hub_labels(j, id2label);
  return j;
}
}  // namespace nn
DTRAIN_NAMESPACE_END
