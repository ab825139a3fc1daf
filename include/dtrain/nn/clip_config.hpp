// SPDX-License-Identifier: Apache-2.0
#pragma once
// nn::CLIPTextConfig, nn::CLIPVisionConfig and nn::CLIPConfig: CLIP's sizes as Hugging Face's
// config.json holds them (transformers' classes of the same names), read with from_pretrained(dir
// or file) and written back as the same JSON by save_pretrained.
//
// A CLIPModel's config.json nests the towers ("text_config", "vision_config"); the tower configs
// read either their own file (model_type "clip_text_model" / "clip_vision_model") or a whole
// CLIP's, taking its nested object, as transformers' CLIPVisionConfig.from_pretrained does. A key
// that is absent takes transformers' default (openai/clip-vit-base-patch32's sizes): the hub's
// older files write the towers as their differences from those defaults. Every key not used here
// is kept in `extra` and written back. A value of the wrong type, a size that cannot build the
// model and an activation not computed here are ConfigErrors naming the file, the key and the value.

#include <cstdint>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include <dtrain/error.hpp>
#include <dtrain/nn/hub_config.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace nn {

/// What both towers' configs hold: one encoder's sizes.
struct CLIPEncoderConfig {
  std::int64_t hidden_size = 512;
  std::int64_t intermediate_size = 2048;
  std::int64_t num_hidden_layers = 12;
  std::int64_t num_attention_heads = 8;
  /// The width of the tower's projection (the WithProjection models'; CLIPModel's is its own).
  std::int64_t projection_dim = 512;
  /// "quick_gelu" (x * sigmoid(1.702 x), CLIP's), "gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu".
  std::string hidden_act = "quick_gelu";
  double layer_norm_eps = 1e-5;
  double attention_dropout = 0.0;
  double initializer_range = 0.02;
  double initializer_factor = 1.0;
  /// config.json's other keys, written back as read.
  nlohmann::json extra = nlohmann::json::object();

  std::int64_t head_dim() const { return hidden_size / num_attention_heads; }
  bool operator==(const CLIPEncoderConfig&) const = default;
};

/// transformers' CLIPTextConfig: a causal transformer over byte-level BPE ids, pooled at the EOS token.
struct CLIPTextConfig : CLIPEncoderConfig {
  std::int64_t vocab_size = 49408;
  std::int64_t max_position_embeddings = 77;
  std::int64_t pad_token_id = 1, bos_token_id = 49406, eos_token_id = 49407;

  /// Parses config.json's object: a clip_text_model's, or a CLIPModel's text_config; `source` names it.
  static CLIPTextConfig from_json(const nlohmann::json& j, const std::string& source = "CLIPTextConfig");
  /// Reads `path`: a model directory (its config.json) or a config.json file.
  static CLIPTextConfig from_pretrained(const std::filesystem::path& path);
  /// config.json's object: model_type "clip_text_model", the fields, then `extra`.
  nlohmann::json to_json() const;
  bool operator==(const CLIPTextConfig&) const = default;
};

/// transformers' CLIPVisionConfig: a ViT over square images cut into square patches.
struct CLIPVisionConfig : CLIPEncoderConfig {
  CLIPVisionConfig() {
    hidden_size = 768;
    intermediate_size = 3072;
    num_attention_heads = 12;
  }
  std::int64_t image_size = 224;
  std::int64_t patch_size = 32;
  std::int64_t num_channels = 3;

  std::int64_t num_patches() const { return (image_size / patch_size) * (image_size / patch_size); }

  /// Parses config.json's object: a clip_vision_model's, or a CLIPModel's vision_config.
  static CLIPVisionConfig from_json(const nlohmann::json& j, const std::string& source = "CLIPVisionConfig");
  static CLIPVisionConfig from_pretrained(const std::filesystem::path& path);
  /// config.json's object: model_type "clip_vision_model", the fields, then `extra`.
  nlohmann::json to_json() const;
  bool operator==(const CLIPVisionConfig&) const = default;
};

/// transformers' CLIPConfig: both towers and the shared embedding space.
struct CLIPConfig {
  CLIPTextConfig text_config;
  CLIPVisionConfig vision_config;
  /// The width of the image and text embeddings (visual_projection, text_projection).
  std::int64_t projection_dim = 512;
  /// logit_scale's initial value (log(1 / 0.07)).
  double logit_scale_init_value = 2.6592;
  double initializer_factor = 1.0;
  nlohmann::json extra = nlohmann::json::object();

  static CLIPConfig from_json(const nlohmann::json& j, const std::string& source = "CLIPConfig");
  static CLIPConfig from_pretrained(const std::filesystem::path& path);
  /// config.json's object: model_type "clip", text_config, vision_config, the fields, then `extra`.
  nlohmann::json to_json() const;
  bool operator==(const CLIPConfig&) const = default;
};

inline CLIPTextConfig CLIPTextConfig::from_pretrained(const std::filesystem::path& path) {
  const auto [j, file] = detail::read_hub_json(path, "config.json");
  return from_json(j, file);
}
inline CLIPVisionConfig CLIPVisionConfig::from_pretrained(const std::filesystem::path& path) {
  const auto [j, file] = detail::read_hub_json(path, "config.json");
  return from_json(j, file);
}
inline CLIPConfig CLIPConfig::from_pretrained(const std::filesystem::path& path) {
  const auto [j, file] = detail::read_hub_json(path, "config.json");
  return from_json(j, file);
}

/// nlohmann::json's conversions (checkpointer::DescribedModel): config.json's form both ways.
inline void to_json(nlohmann::json& j, const CLIPConfig& c) { j = c.to_json(); }
inline void from_json(const nlohmann::json& j, CLIPConfig& c) { c = CLIPConfig::from_json(j); }
inline void to_json(nlohmann::json& j, const CLIPVisionConfig& c) { j = c.to_json(); }
inline void from_json(const nlohmann::json& j, CLIPVisionConfig& c) { c = CLIPVisionConfig::from_json(j); }
inline void to_json(nlohmann::json& j, const CLIPTextConfig& c) { j = c.to_json(); }
inline void from_json(const nlohmann::json& j, CLIPTextConfig& c) { c = CLIPTextConfig::from_json(j); }

}  // namespace nn

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/nn/impl/clip_config.ipp>
#endif
