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
  ViTConfig& with_num_labels(std::int64_t n) {
    id2label.clear();
    for (std::int64_t i = 0; i < n; ++i) id2label.push_back("LABEL_" + std::to_string(i));
    return *this;
  }

  /// Parses config.json's object; `source` names it in errors.
  static ViTConfig from_json(const nlohmann::json& j, const std::string& source = "ViTConfig");
  /// Reads `path`: a Hugging Face model directory (its config.json) or a config.json file.
  static ViTConfig from_pretrained(const std::filesystem::path& path);
  /// config.json's object: model_type "vit", the fields, id2label/label2id, then `extra`.
  nlohmann::json to_json() const;

  bool operator==(const ViTConfig&) const = default;
};

inline ViTConfig ViTConfig::from_json(const nlohmann::json& j, const std::string& source) {
  if (!j.is_object()) throw ConfigError(source + ": a ViT config must be a JSON object, got " + std::string(j.type_name()));
  const auto fail = [&](const std::string& what) { return ConfigError(source + ": " + what); };
  if (j.contains("model_type") && j["model_type"] != "vit")
    throw fail("model_type " + j["model_type"].dump() + " is not supported by nn::ViTModel (only \"vit\")");
  ViTConfig c;
  std::set<std::string> used;
  const auto take = [&](const char* key, auto& field, bool required) {
    used.insert(key);
    if (!j.contains(key)) {
      if (required) throw fail(std::string("\"") + key + "\" is missing; a ViT's config.json names its sizes");
      return;
    }
    using T = std::decay_t<decltype(field)>;
    const auto& v = j.at(key);
    const bool fits = std::is_same_v<T, std::string> ? v.is_string()
                      : std::is_same_v<T, bool>      ? v.is_boolean()
                      : std::is_integral_v<T>        ? v.is_number_integer()
                                                     : v.is_number();
    if (!fits)
      throw fail(std::string("\"") + key + "\" is " + v.dump() + ", which is not " +
                 (std::is_same_v<T, std::string> ? "a string"
                  : std::is_same_v<T, bool>      ? "true or false"
                  : std::is_integral_v<T>        ? "an integer"
                                                 : "a number"));
    v.get_to(field);
  };
  // One number, or [height, width] (transformers accepts both).
  const auto take_pair = [&](const char* key, std::int64_t& h, std::int64_t& w) {
    used.insert(key);
    if (!j.contains(key)) throw fail(std::string("\"") + key + "\" is missing; a ViT's config.json names its sizes");
    const auto& v = j.at(key);
    if (v.is_number_integer()) {
      h = w = v.get<std::int64_t>();
    } else if (v.is_array() && v.size() == 2 && v[0].is_number_integer() && v[1].is_number_integer()) {
      h = v[0].get<std::int64_t>();
      w = v[1].get<std::int64_t>();
    } else {
      throw fail(std::string("\"") + key + "\" is " + v.dump() + ", which is not an integer or [height, width]");
    }
  };
  take("hidden_size", c.hidden_size, true);
  take("num_hidden_layers", c.num_hidden_layers, true);
  take("num_attention_heads", c.num_attention_heads, true);
  take("intermediate_size", c.intermediate_size, true);
  take_pair("image_size", c.image_height, c.image_width);
  take_pair("patch_size", c.patch_height, c.patch_width);
  take("hidden_act", c.hidden_act, false);
  take("hidden_dropout_prob", c.hidden_dropout_prob, false);
  take("attention_probs_dropout_prob", c.attention_probs_dropout_prob, false);
  take("initializer_range", c.initializer_range, false);
  take("layer_norm_eps", c.layer_norm_eps, false);
  take("num_channels", c.num_channels, false);
  take("qkv_bias", c.qkv_bias, false);

  if (c.hidden_act != "gelu" && c.hidden_act != "gelu_new" && c.hidden_act != "gelu_pytorch_tanh" && c.hidden_act != "relu")
    throw fail("\"hidden_act\": \"" + c.hidden_act +
               "\" is not supported (nn::ViTModel computes gelu, gelu_new, gelu_pytorch_tanh and relu)");
  for (const auto& [name, value] : {std::pair{"hidden_size", c.hidden_size}, {"num_hidden_layers", c.num_hidden_layers},
                                    {"num_attention_heads", c.num_attention_heads}, {"intermediate_size", c.intermediate_size},
                                    {"image_size", std::min(c.image_height, c.image_width)},
                                    {"patch_size", std::min(c.patch_height, c.patch_width)},
                                    {"num_channels", c.num_channels}})
    if (value < (std::string(name) == "num_hidden_layers" ? 0 : 1))
      throw fail(std::string("\"") + name + "\" is " + j.value(name, nlohmann::json(value)).dump() + "; it must be positive");
  if (c.hidden_size % c.num_attention_heads != 0)
    throw fail("\"hidden_size\" " + std::to_string(c.hidden_size) + " is not a multiple of \"num_attention_heads\" " +
               std::to_string(c.num_attention_heads));
  if (c.patch_height > c.image_height || c.patch_width > c.image_width)
    throw fail("\"patch_size\" " + j["patch_size"].dump() + " is larger than \"image_size\" " + j["image_size"].dump());

  used.insert("id2label");
  c.id2label = detail::read_hub_labels(j, c.id2label, fail);

  // What says what a file was, not what the model is: save_pretrained writes its own.
  for (const char* key : {"_name_or_path", "architectures", "transformers_version", "model_type", "num_labels",
                          "label2id", "torch_dtype", "dtype"})
    used.insert(key);
  for (const auto& [key, value] : j.items())
    if (!used.count(key)) c.extra[key] = value;
  return c;
}

inline ViTConfig ViTConfig::from_pretrained(const std::filesystem::path& path) {
  const auto [j, file] = detail::read_hub_json(path, "config.json");
  return from_json(j, file);
}

inline nlohmann::json ViTConfig::to_json() const {
  nlohmann::json j = extra.is_object() ? extra : nlohmann::json::object();
  const auto pair = [](std::int64_t h, std::int64_t w) {
    return h == w ? nlohmann::json(h) : nlohmann::json::array({h, w});
  };
  j["model_type"] = "vit";
  j["hidden_size"] = hidden_size;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_attention_heads"] = num_attention_heads;
  j["intermediate_size"] = intermediate_size;
  j["hidden_act"] = hidden_act;
  j["hidden_dropout_prob"] = hidden_dropout_prob;
  j["attention_probs_dropout_prob"] = attention_probs_dropout_prob;
  j["initializer_range"] = initializer_range;
  j["layer_norm_eps"] = layer_norm_eps;
  j["image_size"] = pair(image_height, image_width);
  j["patch_size"] = pair(patch_height, patch_width);
  j["num_channels"] = num_channels;
  j["qkv_bias"] = qkv_bias;
  detail::write_hub_labels(j, id2label);
  return j;
}

/// nlohmann::json's conversions (checkpointer::DescribedModel): config.json's form both ways.
inline void to_json(nlohmann::json& j, const ViTConfig& c) { j = c.to_json(); }
inline void from_json(const nlohmann::json& j, ViTConfig& c) { c = ViTConfig::from_json(j); }

}  // namespace nn

DTRAIN_NAMESPACE_END
