// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of llama_config.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <algorithm>

#include <dtrain/nn/llama_config.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace nn {
DTRAIN_INLINE std::string LlamaConfig::causal_lm_architecture() const {
  return model_type == "mistral" ? "MistralForCausalLM" : model_type == "qwen2" ? "Qwen2ForCausalLM" : "LlamaForCausalLM";
}

DTRAIN_INLINE LlamaConfig LlamaConfig::from_json(const nlohmann::json& j, const std::string& source) {
  if (!j.is_object()) throw ConfigError(source + ": a Llama config must be a JSON object, got " + std::string(j.type_name()));
  detail::HubJsonReader r{j, source, {}};
  LlamaConfig c;
  if (j.contains("model_type")) {
    const auto& t = j["model_type"];
    if (t != "llama" && t != "mistral" && t != "qwen2")
      throw r.fail("model_type " + t.dump() +
                   " is not a Llama-family decoder (nn::LlamaForCausalLM computes \"llama\", \"mistral\" and \"qwen2\"; "
                   "GPT-2 is nn::GPT2LMHeadModel)");
    c.model_type = t.get<std::string>();
  }
  r.take("vocab_size", c.vocab_size, true);
  r.take("hidden_size", c.hidden_size, true);
  r.take("intermediate_size", c.intermediate_size, true);
  r.take("num_hidden_layers", c.num_hidden_layers, true);
  r.take("num_attention_heads", c.num_attention_heads, true);
  r.at_least("num_attention_heads", c.num_attention_heads, 1);
  c.num_key_value_heads = c.num_attention_heads;
  r.take("num_key_value_heads", c.num_key_value_heads);
  c.head_dim = c.hidden_size / c.num_attention_heads;
  r.take("head_dim", c.head_dim);
  r.take("hidden_act", c.hidden_act);
  r.take("max_position_embeddings", c.max_position_embeddings);
  r.take("rms_norm_eps", c.rms_norm_eps);
  r.take("initializer_range", c.initializer_range);
  r.take("attention_dropout", c.attention_dropout);
  r.take("attention_bias", c.attention_bias);
  r.take("mlp_bias", c.mlp_bias);
  r.take("tie_word_embeddings", c.tie_word_embeddings);
  r.take("bos_token_id", c.bos_token_id);
  r.take("pad_token_id", c.pad_token_id);
  r.take("eos_token_id", c.eos_token_id);

  // The rotary embedding: transformers 5's rope_parameters, or rope_theta + rope_scaling.
  nlohmann::json rope = nlohmann::json::object();
  if (j.contains("rope_scaling") && j["rope_scaling"].is_object()) rope = j["rope_scaling"];
  if (j.contains("rope_theta")) rope["rope_theta"] = j["rope_theta"];
  if (j.contains("rope_parameters") && !j["rope_parameters"].is_null()) {
    if (!j["rope_parameters"].is_object()) throw r.fail("\"rope_parameters\" is " + j["rope_parameters"].dump() + ", which is not an object");
    rope.update(j["rope_parameters"]);
  }
  for (const char* key : {"rope_scaling", "rope_theta", "rope_parameters"}) r.used.emplace_back(key);
  if (rope.contains("type") && !rope.contains("rope_type")) rope["rope_type"] = rope["type"];  // the oldest spelling
  {
    detail::HubJsonReader rr{rope, source + " (rope_parameters)", {}};
    rr.take("rope_type", c.rope_type);
    rr.take("rope_theta", c.rope_theta);
    rr.take("factor", c.rope_factor);
    rr.take("low_freq_factor", c.low_freq_factor);
    rr.take("high_freq_factor", c.high_freq_factor);
    c.original_max_position_embeddings = c.max_position_embeddings;
    rr.take("original_max_position_embeddings", c.original_max_position_embeddings);
    double partial = 1.0;
    rr.take("partial_rotary_factor", partial);
    if (partial != 1.0) throw r.fail("\"partial_rotary_factor\" " + std::to_string(partial) + " is not computed here (only 1.0)");
  }
  if (c.rope_type != "default" && c.rope_type != "linear" && c.rope_type != "llama3")
    throw r.fail("rope type \"" + c.rope_type + "\" is not computed here (nn::LlamaModel computes \"default\", \"linear\" and \"llama3\")");
  if (c.rope_type == "llama3" && !(c.high_freq_factor > c.low_freq_factor))
    throw r.fail("llama3 rope: \"high_freq_factor\" must exceed \"low_freq_factor\"");

  // Sliding windows: Mistral's sliding_window on every layer; Qwen2's only with use_sliding_window,
  // on the layers its layer_types name "sliding_attention".
  std::optional<std::int64_t> window;
  r.take("sliding_window", window);
  bool use_sliding_window = c.model_type != "qwen2";
  r.take("use_sliding_window", use_sliding_window);
  std::int64_t max_window_layers = c.num_hidden_layers;
  r.take("max_window_layers", max_window_layers);
  if (window && use_sliding_window) {
    r.at_least("sliding_window", *window, 1);
    c.sliding_window = window;
  }
  r.used.emplace_back("layer_types");
  if (j.contains("layer_types") && !j["layer_types"].is_null()) {
    const auto& types = j["layer_types"];
    if (!types.is_array() || static_cast<std::int64_t>(types.size()) != c.num_hidden_layers)
      throw r.fail("\"layer_types\" must list the " + std::to_string(c.num_hidden_layers) + " layers' kinds, got " + types.dump());
    bool any_sliding = false;
    for (const auto& t : types) {
      if (t != "full_attention" && t != "sliding_attention")
        throw r.fail("\"layer_types\" holds " + t.dump() + "; the kinds computed are \"full_attention\" and \"sliding_attention\"");
      c.sliding_layers.push_back(t == "sliding_attention");
      any_sliding = any_sliding || t == "sliding_attention";
    }
    if (any_sliding && !c.sliding_window) throw r.fail("\"layer_types\" names sliding layers but \"sliding_window\" is null");
    if (!any_sliding) c.sliding_layers.clear();
    if (!any_sliding && c.model_type == "qwen2") c.sliding_window.reset();
  } else if (c.model_type == "qwen2" && c.sliding_window) {
    for (std::int64_t i = 0; i < c.num_hidden_layers; ++i) c.sliding_layers.push_back(i >= max_window_layers);
  }
  if (c.model_type == "qwen2") {
    // Qwen2 writes these whether or not it uses them: kept as read.
    if (j.contains("sliding_window")) c.extra["sliding_window"] = j["sliding_window"];
    if (j.contains("use_sliding_window")) c.extra["use_sliding_window"] = j["use_sliding_window"];
    if (j.contains("max_window_layers")) c.extra["max_window_layers"] = j["max_window_layers"];
  }

  r.at_least("vocab_size", c.vocab_size, 1);
  r.at_least("hidden_size", c.hidden_size, 1);
  r.at_least("intermediate_size", c.intermediate_size, 1);
  r.at_least("num_hidden_layers", c.num_hidden_layers, 0);
  r.at_least("num_key_value_heads", c.num_key_value_heads, 1);
  r.at_least("head_dim", c.head_dim, 2);
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    throw r.fail("\"num_attention_heads\" " + std::to_string(c.num_attention_heads) + " is not a multiple of \"num_key_value_heads\" " +
                 std::to_string(c.num_key_value_heads));
  if (c.head_dim % 2 != 0) throw r.fail("\"head_dim\" " + std::to_string(c.head_dim) + " must be even (the rotary embedding pairs its halves)");
  if (c.hidden_act != "silu" && c.hidden_act != "swish" && c.hidden_act != "gelu" && c.hidden_act != "gelu_pytorch_tanh" &&
      c.hidden_act != "relu")
    throw r.fail("\"hidden_act\": \"" + c.hidden_act + "\" is not supported (silu, gelu, gelu_pytorch_tanh, relu)");
  for (auto id : c.eos_token_id)
    if (id < 0 || id >= c.vocab_size) throw r.fail("\"eos_token_id\" " + std::to_string(id) + " is outside the vocabulary");
  auto extra = r.rest();
  extra.update(c.extra);
  c.extra = std::move(extra);
  return c;
}

DTRAIN_INLINE nlohmann::json LlamaConfig::to_json() const {
  nlohmann::json j = extra.is_object() ? extra : nlohmann::json::object();
  j["model_type"] = model_type;
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = num_key_value_heads;
  j["head_dim"] = head_dim;
  j["hidden_act"] = hidden_act;
  j["max_position_embeddings"] = max_position_embeddings;
  j["rms_norm_eps"] = rms_norm_eps;
  j["initializer_range"] = initializer_range;
  j["attention_dropout"] = attention_dropout;
  if (model_type != "qwen2") j["attention_bias"] = attention_bias;
  if (model_type == "llama") j["mlp_bias"] = mlp_bias;
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["bos_token_id"] = bos_token_id ? nlohmann::json(*bos_token_id) : nlohmann::json(nullptr);
  j["pad_token_id"] = pad_token_id ? nlohmann::json(*pad_token_id) : nlohmann::json(nullptr);
  j["eos_token_id"] = detail::ids_json(eos_token_id);
  nlohmann::json rope = {{"rope_type", rope_type}, {"rope_theta", rope_theta}};
  if (rope_type != "default") rope["factor"] = rope_factor;
  if (rope_type == "llama3") {
    rope["low_freq_factor"] = low_freq_factor;
    rope["high_freq_factor"] = high_freq_factor;
    rope["original_max_position_embeddings"] = original_max_position_embeddings;
  }
  j["rope_parameters"] = rope;
  if (model_type == "mistral") j["sliding_window"] = sliding_window ? nlohmann::json(*sliding_window) : nlohmann::json(nullptr);
  if (!sliding_layers.empty()) {
    j["layer_types"] = nlohmann::json::array();
    for (bool s : sliding_layers) j["layer_types"].push_back(s ? "sliding_attention" : "full_attention");
  }
  return j;
}

}  // namespace nn
DTRAIN_NAMESPACE_END
