// SPDX-License-Identifier: Apache-2.0
#pragma once
// nn::LlamaConfig: a Llama-family decoder's sizes as Hugging Face's `config.json` holds them
// (LlamaConfig of transformers; MistralConfig and Qwen2Config, which make the same graph), read
// with LlamaConfig::from_pretrained(dir_or_file) and written back as the same JSON
// (save_pretrained, and model_config.json in dtrain's checkpoints).
//
// The rotary embedding's settings are read in both spellings: transformers 5's `rope_parameters`
// ({"rope_type", "rope_theta", "factor", ...}) and the older `rope_theta` + `rope_scaling`; they are
// written back as `rope_parameters`. The kinds computed: "default", "linear" and "llama3"; another
// (yarn, dynamic, longrope) is a ConfigError naming it. Mistral's `sliding_window` and Qwen2's
// `use_sliding_window` / `layer_types` make some layers attend to the last `sliding_window` tokens
// only, as transformers' masks do. As nn::BertConfig: the keys the model uses are fields, every other
// key is kept in `extra` and written back; the sizes are required (a missing one is a ConfigError
// naming the file and the key), the rest take transformers' defaults.

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <dtrain/error.hpp>
#include <dtrain/nn/hub_config.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace nn {

struct LlamaConfig {
  /// "llama", "mistral" or "qwen2" (Qwen2 has biases on q, k and v; the others `attention_bias`).
  std::string model_type = "llama";
  std::int64_t vocab_size = 32000;
  std::int64_t hidden_size = 4096;
  std::int64_t intermediate_size = 11008;
  std::int64_t num_hidden_layers = 32;
  std::int64_t num_attention_heads = 32;
  /// Grouped-query attention: the key and value heads (num_attention_heads when absent).
  std::int64_t num_key_value_heads = 32;
  /// A head's width (hidden_size / num_attention_heads when absent).
  std::int64_t head_dim = 128;
  /// "silu" (SwiGLU), "gelu", "gelu_pytorch_tanh" or "relu".
  std::string hidden_act = "silu";
  std::int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  double initializer_range = 0.02;
  double attention_dropout = 0.0;
  bool attention_bias = false, mlp_bias = false;
  bool tie_word_embeddings = false;
  /// The rotary embedding: rope_type "default", "linear" (positions divided by factor) or "llama3"
  /// (factor, low_freq_factor, high_freq_factor, original_max_position_embeddings).
  std::string rope_type = "default";
  double rope_theta = 10000.0;
  double rope_factor = 1.0, low_freq_factor = 1.0, high_freq_factor = 4.0;
  std::int64_t original_max_position_embeddings = 0;
  /// Layers that attend to the last `sliding_window` tokens only (Mistral: every layer; Qwen2: its
  /// layer_types'). Empty: every layer sees every earlier token.
  std::optional<std::int64_t> sliding_window;
  std::vector<bool> sliding_layers;
  std::optional<std::int64_t> bos_token_id, pad_token_id;
  /// One id or several (Llama 3 instruct: end_of_text and eot); generation stops at any.
  std::vector<std::int64_t> eos_token_id;
  /// config.json's other keys, written back as read.
  nlohmann::json extra = nlohmann::json::object();

  /// Whether q, k, v and o carry biases.
  bool qkv_bias() const { return attention_bias || model_type == "qwen2"; }
  bool o_bias() const { return attention_bias; }
  /// The attention window of layer `i` (none: the whole sequence).
  std::optional<std::int64_t> window_of(std::int64_t i) const {
    if (!sliding_window) return std::nullopt;
    if (sliding_layers.empty() || sliding_layers[static_cast<std::size_t>(i)]) return sliding_window;
    return std::nullopt;
  }
  /// transformers' class name for this model_type's causal LM (config.json's `architectures`).
  std::string causal_lm_architecture() const;

  /// Parses config.json's object; `source` names it in errors.
  static LlamaConfig from_json(const nlohmann::json& j, const std::string& source = "LlamaConfig");
  /// Reads `path`: a Hugging Face model directory (its config.json) or a config.json file.
  static LlamaConfig from_pretrained(const std::filesystem::path& path) {
    const auto [j, file] = detail::read_hub_json(path, "config.json");
    return from_json(j, file);
  }
  /// config.json's object: model_type, the fields (the rotary settings as rope_parameters), then `extra`.
  nlohmann::json to_json() const;

  bool operator==(const LlamaConfig&) const = default;
};

/// nlohmann::json's conversions (checkpointer::DescribedModel): config.json's form both ways.
inline void to_json(nlohmann::json& j, const LlamaConfig& c) { j = c.to_json(); }
inline void from_json(const nlohmann::json& j, LlamaConfig& c) { c = LlamaConfig::from_json(j); }

}  // namespace nn

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/nn/impl/llama_config.ipp>
#endif
