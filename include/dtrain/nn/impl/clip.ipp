// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of clip.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <algorithm>
#include <cmath>
#include <optional>
#include <utility>
#include <vector>

#include <c10/util/StringUtil.h>

#include <dtrain/nn/clip.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace nn {

namespace detail {
DTRAIN_INLINE torch::nn::Embedding clip_embedding(torch::nn::Module& parent, const std::string& name, std::int64_t count,
                                                  std::int64_t width, double std) {
  auto e = parent.register_module(name, torch::nn::Embedding(count, width));
  torch::NoGradGuard no_grad;
  e->weight.normal_(0, std);
  return e;
}

DTRAIN_INLINE torch::nn::ModuleList clip_layers(torch::nn::Module& parent, const CLIPEncoderConfig& c) {
  auto layers = hub_node(parent, "encoder")->register_module("layers", torch::nn::ModuleList());
  for (std::int64_t i = 0; i < c.num_hidden_layers; ++i) layers->push_back(CLIPEncoderLayer(c));
  return layers;
}

DTRAIN_INLINE torch::Tensor run_clip_layers(const torch::nn::ModuleList& layers, torch::Tensor x, const DecoderMask& mask) {
  for (const auto& l : *layers) x = l->as<CLIPEncoderLayerImpl>()->forward(x, mask);
  return x;
}
}  // namespace detail

DTRAIN_INLINE CLIPEncoderLayerImpl::CLIPEncoderLayerImpl(const CLIPEncoderConfig& c) : config(c) {
  const auto h = c.hidden_size;
  // transformers' CLIPPreTrainedModel._init_weights.
  const double in_std = std::pow(static_cast<double>(h), -0.5) * std::pow(2.0 * static_cast<double>(c.num_hidden_layers), -0.5) *
                        c.initializer_factor;
  const double out_std = std::pow(static_cast<double>(h), -0.5) * c.initializer_factor;
  const double fc_std = std::pow(2.0 * static_cast<double>(h), -0.5) * c.initializer_factor;
  auto attn = detail::hub_node(*this, "self_attn");
  q_proj = detail::hub_linear(*attn, "q_proj", h, h, in_std);
  k_proj = detail::hub_linear(*attn, "k_proj", h, h, in_std);
  v_proj = detail::hub_linear(*attn, "v_proj", h, h, in_std);
  out_proj = detail::hub_linear(*attn, "out_proj", h, h, out_std);
  layer_norm1 = detail::hub_norm(*this, "layer_norm1", h, c.layer_norm_eps);
  auto mlp = detail::hub_node(*this, "mlp");
  fc1 = detail::hub_linear(*mlp, "fc1", h, c.intermediate_size, fc_std);
  fc2 = detail::hub_linear(*mlp, "fc2", c.intermediate_size, h, in_std);
  layer_norm2 = detail::hub_norm(*this, "layer_norm2", h, c.layer_norm_eps);
}

DTRAIN_INLINE torch::Tensor CLIPEncoderLayerImpl::forward(const torch::Tensor& x, const DecoderMask& mask) {
  const auto b = x.size(0), s = x.size(1), heads = config.num_attention_heads, d = config.head_dim();
  const auto split = [&](const torch::nn::Linear& l, const torch::Tensor& h) {
    return detail::apply(l, h).view({b, s, heads, d}).transpose(1, 2);
  };
  const auto n1 = detail::apply(layer_norm1, x, config.layer_norm_eps);
  const auto attended = decoder_attention(split(q_proj, n1), split(k_proj, n1), split(v_proj, n1), mask,
                                          std::pow(static_cast<double>(d), -0.5), config.attention_dropout, is_training());
  const auto h = x + detail::apply(out_proj, attended);
  const auto n2 = detail::apply(layer_norm2, h, config.layer_norm_eps);
  return h + detail::apply(fc2, detail::hub_activation(config.hidden_act, detail::apply(fc1, n2)));
}

DTRAIN_INLINE CLIPVisionModelImpl::CLIPVisionModelImpl(const Config& c) : config(c) {
  auto embeddings = detail::hub_node(*this, "embeddings");
  class_embedding = embeddings->register_parameter("class_embedding", torch::empty({c.hidden_size}));
  patch_embedding = embeddings->register_module(
      "patch_embedding",
      torch::nn::Conv2d(torch::nn::Conv2dOptions(c.num_channels, c.hidden_size, c.patch_size).stride(c.patch_size).bias(false)));
  position_embedding = detail::clip_embedding(*embeddings, "position_embedding", c.num_patches() + 1, c.hidden_size,
                                              c.initializer_range * c.initializer_factor);
  {
    torch::NoGradGuard no_grad;
    class_embedding.normal_(0, std::pow(static_cast<double>(c.hidden_size), -0.5) * c.initializer_factor);
    patch_embedding->weight.normal_(0, c.initializer_range * c.initializer_factor);
  }
  pre_layrnorm = detail::hub_norm(*this, "pre_layrnorm", c.hidden_size, c.layer_norm_eps);
  layers = detail::clip_layers(*this, c);
  post_layernorm = detail::hub_norm(*this, "post_layernorm", c.hidden_size, c.layer_norm_eps);
}

DTRAIN_INLINE CLIPTowerOutput CLIPVisionModelImpl::forward(const torch::Tensor& pixel_values) {
  if (pixel_values.dim() != 4 || pixel_values.size(1) != config.num_channels || pixel_values.size(2) != config.image_size ||
      pixel_values.size(3) != config.image_size)
    throw ConfigError("nn::CLIPVisionModel: pixel_values must be [batch, " + std::to_string(config.num_channels) + ", " +
                      std::to_string(config.image_size) + ", " + std::to_string(config.image_size) +
                      "] (the config's num_channels and image_size), got " + c10::str(pixel_values.sizes()) +
                      "; resize and crop the images (data::CLIPImageProcessor)");
  const auto b = pixel_values.size(0);
  const auto w = patch_embedding->weight;
  auto x = at::conv2d(pixel_values.to(w.scalar_type()), w, {}, {config.patch_size, config.patch_size})
               .flatten(2)
               .transpose(1, 2);  // [batch, patches, hidden]
  x = at::cat({class_embedding.to(x.scalar_type()).expand({b, 1, -1}), x}, 1) + position_embedding->weight;
  x = detail::run_clip_layers(layers, detail::apply(pre_layrnorm, x, config.layer_norm_eps), {});
  return {x, detail::apply(post_layernorm, x.select(1, 0), config.layer_norm_eps)};
}

DTRAIN_INLINE CLIPTextModelImpl::CLIPTextModelImpl(const Config& c) : config(c) {
  auto embeddings = detail::hub_node(*this, "embeddings");
  const double init_std = 0.02 * c.initializer_factor;
  token_embedding = detail::clip_embedding(*embeddings, "token_embedding", c.vocab_size, c.hidden_size, init_std);
  position_embedding = detail::clip_embedding(*embeddings, "position_embedding", c.max_position_embeddings, c.hidden_size, init_std);
  layers = detail::clip_layers(*this, c);
  final_layer_norm = detail::hub_norm(*this, "final_layer_norm", c.hidden_size, c.layer_norm_eps);
}

DTRAIN_INLINE CLIPTowerOutput CLIPTextModelImpl::forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask) {
  if (input_ids.dim() != 2 || input_ids.size(1) < 1 || input_ids.size(1) > config.max_position_embeddings)
    throw ConfigError("nn::CLIPTextModel: input_ids must be [batch, sequence] with 1 to " +
                      std::to_string(config.max_position_embeddings) + " (max_position_embeddings) tokens, got " +
                      c10::str(input_ids.sizes()));
  const auto b = input_ids.size(0), s = input_ids.size(1);
  const auto ids = input_ids.to(torch::kInt64);
  auto x = at::embedding(token_embedding->weight, ids) + position_embedding->weight.slice(0, 0, s);
  const auto mask = decoder_mask(attention_mask, b, s, 0, std::nullopt, x.scalar_type(), x.device());
  x = detail::apply(final_layer_norm, detail::run_clip_layers(layers, x, mask), config.layer_norm_eps);
  // transformers' pooling: files from before its fix (eos_token_id 2) pool at the highest id,
  // which is 49407 in the original vocabulary; others at the first eos_token_id.
  torch::Tensor at;
  if (config.eos_token_id == 2) {
    at = ids.argmax(-1);
  } else {
    const auto is_eos = ids == config.eos_token_id;
    if (!is_eos.any(-1).all().item<bool>())
      throw DataError("nn::CLIPTextModel: a row of input_ids has no eos_token_id " + std::to_string(config.eos_token_id) +
                      ", where the text is pooled; end every row with it (the tokenizer's </s>)");
    at = is_eos.to(torch::kInt).argmax(-1);
  }
  return {x, x.index({torch::arange(b, at.options()), at})};
}

DTRAIN_INLINE CLIPModelImpl::CLIPModelImpl(const Config& c) : config(c) {
  text_model = register_module("text_model", CLIPTextModel(c.text_config));
  vision_model = register_module("vision_model", CLIPVisionModel(c.vision_config));
  visual_projection = detail::hub_linear(*this, "visual_projection", c.vision_config.hidden_size, c.projection_dim,
                                         std::pow(static_cast<double>(c.vision_config.hidden_size), -0.5) * c.initializer_factor,
                                         false);
  text_projection = detail::hub_linear(*this, "text_projection", c.text_config.hidden_size, c.projection_dim,
                                       std::pow(static_cast<double>(c.text_config.hidden_size), -0.5) * c.initializer_factor, false);
  logit_scale = register_parameter("logit_scale", torch::tensor(c.logit_scale_init_value, torch::kFloat));
}

DTRAIN_INLINE torch::Tensor CLIPModelImpl::get_image_features(const torch::Tensor& pixel_values) {
  return detail::apply(visual_projection, vision_model(pixel_values).pooler_output);
}

DTRAIN_INLINE torch::Tensor CLIPModelImpl::get_text_features(const torch::Tensor& input_ids, const torch::Tensor& attention_mask) {
  return detail::apply(text_projection, text_model(input_ids, attention_mask).pooler_output);
}

DTRAIN_INLINE CLIPOutput CLIPModelImpl::forward(const torch::Tensor& input_ids, const torch::Tensor& pixel_values,
                                                const torch::Tensor& attention_mask) {
  const auto normalise = [](const torch::Tensor& t) { return t / t.pow(2).sum(-1, true).pow(0.5); };
  auto image = normalise(get_image_features(pixel_values));
  auto text = normalise(get_text_features(input_ids, attention_mask));
  auto per_text = at::matmul(text, image.t()) * logit_scale.exp();
  return {per_text.t(), per_text, text, image};
}

namespace detail {
DTRAIN_INLINE weights::LoadReport load_clip(torch::nn::Module& model, const std::string& tower, const std::filesystem::path& path,
                                            weights::LoadOptions options) {
  auto state = weights::read(path);
  const auto source = weights::detail::weights_format(path).second.string();
  const auto ends = [](const std::string& k, const std::string& tail) {
    return k.size() >= tail.size() && k.compare(k.size() - tail.size(), tail.size(), tail) == 0;
  };
  // A tower's own keys may carry its prefix (a whole CLIP's file, or transformers 4's tower files).
  const bool prefixed = !tower.empty() && options.prefix.empty() &&
                        std::any_of(state.begin(), state.end(), [&](const auto& kv) { return kv.first.rfind(tower, 0) == 0; });
  // A tower's own file (transformers 5's names) into a whole CLIP: say so, rather than list 78 names.
  if (tower.empty() && options.prefix.empty()) {
    bool vision = false, text = false;
    for (const auto& kv : state) {
      vision = vision || kv.first == "embeddings.class_embedding";
      text = text || kv.first == "embeddings.token_embedding.weight";
    }
    if (vision || text)
      throw Error(source + " holds a CLIP " + (vision ? "vision" : "text") + " tower alone (transformers' " +
                  (vision ? "CLIPVisionModel" : "CLIPTextModel") + "), not a whole CLIPModel: load it into nn::" +
                  (vision ? "CLIPVisionModel or into clip->vision_model" : "CLIPTextModel or into clip->text_model"));
  }
  std::vector<std::string> passed_over;
  std::erase_if(state, [&](const auto& kv) {
    const bool extra = ends(kv.first, ".position_ids") || kv.first == "position_ids" || (prefixed && kv.first.rfind(tower, 0) != 0);
    if (extra) passed_over.push_back(kv.first);
    return extra;
  });
  if (prefixed) options.prefix = tower;
  auto report = weights::load_state_dict(model, std::move(state), source, std::move(options));
  report.unexpected.insert(report.unexpected.end(), passed_over.begin(), passed_over.end());
  return report;
}
}  // namespace detail

}  // namespace nn
DTRAIN_NAMESPACE_END
