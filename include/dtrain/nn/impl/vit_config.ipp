// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of vit_config.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/nn/vit_config.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace nn {

DTRAIN_INLINE ViTConfig& ViTConfig::with_num_labels(std::int64_t n) {
  id2label.clear();
  for (std::int64_t i = 0; i < n; ++i) id2label.push_back("LABEL_" + std::to_string(i));
  return *this;
}

DTRAIN_INLINE ViTConfig ViTConfig::from_json(const nlohmann::json& j, const std::string& source) {
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

DTRAIN_INLINE nlohmann::json ViTConfig::to_json() const {
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
}  // namespace nn
DTRAIN_NAMESPACE_END
