// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of clip_config.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/nn/clip_config.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace nn {
namespace detail {

/// The keys both towers share, read and checked.
DTRAIN_INLINE void read_clip_encoder(HubJsonReader& r, CLIPEncoderConfig& c) {
  r.take("hidden_size", c.hidden_size);
  r.take("intermediate_size", c.intermediate_size);
  r.take("num_hidden_layers", c.num_hidden_layers);
  r.take("num_attention_heads", c.num_attention_heads);
  r.take("projection_dim", c.projection_dim);
  r.take("hidden_act", c.hidden_act);
  r.take("layer_norm_eps", c.layer_norm_eps);
  r.take("attention_dropout", c.attention_dropout);
  r.take("initializer_range", c.initializer_range);
  r.take("initializer_factor", c.initializer_factor);
  for (const auto& [key, value] : {std::pair{"hidden_size", c.hidden_size}, {"intermediate_size", c.intermediate_size},
                                   {"num_attention_heads", c.num_attention_heads}, {"projection_dim", c.projection_dim}})
    r.at_least(key, value, 1);
  r.at_least("num_hidden_layers", c.num_hidden_layers, 0);
  if (c.hidden_size % c.num_attention_heads != 0)
    throw r.fail("\"hidden_size\" " + std::to_string(c.hidden_size) + " is not a multiple of \"num_attention_heads\" " +
                 std::to_string(c.num_attention_heads));
  const auto& a = c.hidden_act;
  if (a != "quick_gelu" && a != "gelu" && a != "gelu_new" && a != "gelu_pytorch_tanh" && a != "relu" && a != "silu")
    throw r.fail("\"hidden_act\": \"" + a + "\" is not supported (quick_gelu, gelu, gelu_new, gelu_pytorch_tanh, relu, silu)");
  if (!(c.attention_dropout >= 0 && c.attention_dropout < 1))
    throw r.fail("\"attention_dropout\" is " + std::to_string(c.attention_dropout) + "; it must be in [0, 1)");
}

DTRAIN_INLINE nlohmann::json clip_encoder_json(const CLIPEncoderConfig& c, const char* model_type) {
  nlohmann::json j = c.extra.is_object() ? c.extra : nlohmann::json::object();
  j["model_type"] = model_type;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["projection_dim"] = c.projection_dim;
  j["hidden_act"] = c.hidden_act;
  j["layer_norm_eps"] = c.layer_norm_eps;
  j["attention_dropout"] = c.attention_dropout;
  j["initializer_range"] = c.initializer_range;
  j["initializer_factor"] = c.initializer_factor;
  return j;
}

/// A tower's object in `j`: `j` itself (model_type `own` or none), or a whole CLIP's `nested` object.
/// Returns the object and its name for errors.
DTRAIN_INLINE std::pair<const nlohmann::json*, std::string> clip_tower_json(const nlohmann::json& j, const std::string& source,
                                                                             const char* own, const char* nested) {
  if (!j.is_object()) throw ConfigError(source + ": a CLIP config must be a JSON object, got " + std::string(j.type_name()));
  if (!j.contains("model_type") || j["model_type"] == own) return {&j, source};
  if (j["model_type"] != "clip")
    throw ConfigError(source + ": model_type " + j["model_type"].dump() + " is not \"" + own + "\" or \"clip\"");
  if (!j.contains(nested) || !j[nested].is_object())
    throw ConfigError(source + ": a CLIP config.json needs an object \"" + nested + "\"");
  return {&j[nested], source + " (" + nested + ")"};
}

}  // namespace detail

DTRAIN_INLINE CLIPTextConfig CLIPTextConfig::from_json(const nlohmann::json& json, const std::string& source) {
  const auto [j, name] = detail::clip_tower_json(json, source, "clip_text_model", "text_config");
  detail::HubJsonReader r{*j, name, {}};
  CLIPTextConfig c;
  detail::read_clip_encoder(r, c);
  r.take("vocab_size", c.vocab_size);
  r.take("max_position_embeddings", c.max_position_embeddings);
  r.take("pad_token_id", c.pad_token_id);
  r.take("bos_token_id", c.bos_token_id);
  r.take("eos_token_id", c.eos_token_id);
  r.at_least("vocab_size", c.vocab_size, 1);
  r.at_least("max_position_embeddings", c.max_position_embeddings, 1);
  c.extra = r.rest();
  return c;
}

DTRAIN_INLINE nlohmann::json CLIPTextConfig::to_json() const {
  auto j = detail::clip_encoder_json(*this, "clip_text_model");
  j["vocab_size"] = vocab_size;
  j["max_position_embeddings"] = max_position_embeddings;
  j["pad_token_id"] = pad_token_id;
  j["bos_token_id"] = bos_token_id;
  j["eos_token_id"] = eos_token_id;
  return j;
}

DTRAIN_INLINE CLIPVisionConfig CLIPVisionConfig::from_json(const nlohmann::json& json, const std::string& source) {
  const auto [j, name] = detail::clip_tower_json(json, source, "clip_vision_model", "vision_config");
  detail::HubJsonReader r{*j, name, {}};
  CLIPVisionConfig c;
  detail::read_clip_encoder(r, c);
  r.take("image_size", c.image_size);
  r.take("patch_size", c.patch_size);
  r.take("num_channels", c.num_channels);
  r.at_least("patch_size", c.patch_size, 1);
  r.at_least("image_size", c.image_size, c.patch_size);
  r.at_least("num_channels", c.num_channels, 1);
  c.extra = r.rest();
  return c;
}

DTRAIN_INLINE nlohmann::json CLIPVisionConfig::to_json() const {
  auto j = detail::clip_encoder_json(*this, "clip_vision_model");
  j["image_size"] = image_size;
  j["patch_size"] = patch_size;
  j["num_channels"] = num_channels;
  return j;
}

DTRAIN_INLINE CLIPConfig CLIPConfig::from_json(const nlohmann::json& j, const std::string& source) {
  if (!j.is_object()) throw ConfigError(source + ": a CLIP config must be a JSON object, got " + std::string(j.type_name()));
  if (j.contains("model_type") && j["model_type"] != "clip")
    throw ConfigError(source + ": model_type " + j["model_type"].dump() +
                      " is not \"clip\" (a tower's own config is nn::CLIPTextConfig's or nn::CLIPVisionConfig's)");
  detail::HubJsonReader r{j, source, {"text_config", "vision_config"}};
  CLIPConfig c;
  const auto tower = [&](const char* key) {
    if (j.contains(key) && !j[key].is_null() && !j[key].is_object())
      throw r.fail(std::string("\"") + key + "\" is " + j[key].dump() + ", which is not an object");
    nlohmann::json t = j.contains(key) && j[key].is_object() ? j[key] : nlohmann::json::object();
    t.erase("model_type");
    return t;
  };
  c.text_config = CLIPTextConfig::from_json(tower("text_config"), source + " (text_config)");
  c.vision_config = CLIPVisionConfig::from_json(tower("vision_config"), source + " (vision_config)");
  r.take("projection_dim", c.projection_dim);
  r.take("logit_scale_init_value", c.logit_scale_init_value);
  r.take("initializer_factor", c.initializer_factor);
  r.at_least("projection_dim", c.projection_dim, 1);
  c.extra = r.rest();
  return c;
}

DTRAIN_INLINE nlohmann::json CLIPConfig::to_json() const {
  nlohmann::json j = extra.is_object() ? extra : nlohmann::json::object();
  j["model_type"] = "clip";
  j["text_config"] = text_config.to_json();
  j["vision_config"] = vision_config.to_json();
  j["projection_dim"] = projection_dim;
  j["logit_scale_init_value"] = logit_scale_init_value;
  j["initializer_factor"] = initializer_factor;
  return j;
}

}  // namespace nn
DTRAIN_NAMESPACE_END
