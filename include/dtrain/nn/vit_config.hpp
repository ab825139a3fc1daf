// SPDX-License-Identifier: Apache-2.0
#pragma once
// nn::ViTConfig: a Vision Transformer's sizes and labels as Hugging Face's `config.json` holds them
// (ViTConfig of transformers), read with ViTConfig::from_pretrained(dir_or_file) and written back
// as the same JSON (save_pretrained, and model_config.json in dtrain's checkpoints).
//
// As nn::BertConfig: the keys the model uses are fields, every other key (encoder_stride,
// pooler_output_size, pooler_act, problem_type, ...) is kept in `extra` and written back. The
// sizes that make the model (hidden_size, num_hidden_layers, num_attention_heads,
// intermediate_size, image_size, patch_size) are required: a config.json without one is a
// ConfigError naming the file and the key, rather than a vit-base built from transformers'
// defaults. The other keys take transformers' defaults. A value of the wrong type, a size that
// cannot build the model and a setting not computed here are ConfigErrors naming file, key and value.

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <dtrain/error.hpp>
#include <dtrain/nn/hub_config.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace nn {

struct ViTConfig {
  std::int64_t hidden_size = 768;
  std::int64_t num_hidden_layers = 12;
  std::int64_t num_attention_heads = 12;
  std::int64_t intermediate_size = 3072;
  /// "gelu" (exact, erf), "gelu_new" or "gelu_pytorch_tanh" (tanh approximation), "relu".
  std::string hidden_act = "gelu";
  double hidden_dropout_prob = 0.0;
  double attention_probs_dropout_prob = 0.0;
  double initializer_range = 0.02;
  double layer_norm_eps = 1e-12;
  /// The input's height and width (config.json: one number, or [height, width]).
  std::int64_t image_height = 224, image_width = 224;
  /// A patch's height and width (config.json's patch_size, as image_size).
  std::int64_t patch_height = 16, patch_width = 16;
  std::int64_t num_channels = 3;
  /// Biases on the attention's query, key and value.
  bool qkv_bias = true;
  /// Label names by id (config.json's id2label; label2id is its inverse). Its size is num_labels.
  std::vector<std::string> id2label = {"LABEL_0", "LABEL_1"};
  /// config.json's other keys, written back as read.
  nlohmann::json extra = nlohmann::json::object();

  std::int64_t num_labels() const { return static_cast<std::int64_t>(id2label.size()); }
  /// The patches of an image: the sequence is one longer (the CLS token first).
  std::int64_t num_patches() const { return (image_height / patch_height) * (image_width / patch_width); }
  /// `n` labels named LABEL_0 ... LABEL_{n-1} (transformers' default names).
  ViTConfig& with_num_labels(std::int64_t n);

  /// Parses config.json's object; `source` names it in errors.
  static ViTConfig from_json(const nlohmann::json& j, const std::string& source = "ViTConfig");
  /// Reads `path`: a Hugging Face model directory (its config.json) or a config.json file.
  static ViTConfig from_pretrained(const std::filesystem::path& path);
  /// config.json's object: model_type "vit", the fields, id2label/label2id, then `extra`.
  nlohmann::json to_json() const;

  bool operator==(const ViTConfig&) const = default;
};

inline ViTConfig ViTConfig::from_pretrained(const std::filesystem::path& path) {
  const auto [j, file] = detail::read_hub_json(path, "config.json");
  return from_json(j, file);
}

/// nlohmann::json's conversions (checkpointer::DescribedModel): config.json's form both ways.
inline void to_json(nlohmann::json& j, const ViTConfig& c) { j = c.to_json(); }
inline void from_json(const nlohmann::json& j, ViTConfig& c) { c = ViTConfig::from_json(j); }

}  // namespace nn

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/nn/impl/vit_config.ipp>
#endif
