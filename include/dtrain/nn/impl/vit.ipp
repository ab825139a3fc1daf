// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of vit.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/nn/vit.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace nn {

DTRAIN_INLINE ViTEmbeddingsImpl::ViTEmbeddingsImpl(const ViTConfig& c) : config(c) {
  cls_token = register_parameter("cls_token", torch::empty({1, 1, c.hidden_size}));
  position_embeddings = register_parameter("position_embeddings", torch::empty({1, c.num_patches() + 1, c.hidden_size}));
  projection = detail::hub_node(*this, "patch_embeddings")
                   ->register_module("projection", torch::nn::Conv2d(torch::nn::Conv2dOptions(
                                                                           c.num_channels, c.hidden_size, {c.patch_height, c.patch_width})
                                                                           .stride({c.patch_height, c.patch_width})));
  // transformers' ViTPreTrainedModel._init_weights: trunc_normal(0, initializer_range) cut at
  // +-2 (not +-2 std: with std 0.02 nothing is cut), zero biases.
  torch::NoGradGuard no_grad;
  for (auto* t : {&cls_token, &position_embeddings, &projection->weight}) t->normal_(0, c.initializer_range);
  projection->bias.zero_();
}

DTRAIN_INLINE torch::Tensor ViTEmbeddingsImpl::forward(const torch::Tensor& pixel_values) {
  if (pixel_values.dim() != 4 || pixel_values.size(1) != config.num_channels ||
      pixel_values.size(2) != config.image_height || pixel_values.size(3) != config.image_width) {
    std::string got;
    for (auto s : pixel_values.sizes()) got += (got.empty() ? "" : ", ") + std::to_string(s);
    throw ConfigError("nn::ViTModel: pixel_values must be [batch, " + std::to_string(config.num_channels) + ", " +
                      std::to_string(config.image_height) + ", " + std::to_string(config.image_width) +
                      "] (the config's num_channels and image_size), got [" + got +
                      "]; resize the images (data::ViTImageProcessor)");
  }
  const auto b = pixel_values.size(0);
  auto x = at::conv2d(pixel_values, projection->weight, projection->bias, {config.patch_height, config.patch_width})
               .flatten(2)
               .transpose(1, 2);  // [batch, patches, hidden]
  x = at::cat({cls_token.to(x.scalar_type()).expand({b, -1, -1}), x}, 1) + position_embeddings;
  const double p = config.hidden_dropout_prob;
  return p > 0 && is_training() ? at::dropout(x, p, true) : x;
}

DTRAIN_INLINE HubEncoderLayerOptions vit_layer_options(const ViTConfig& c) {
  return HubEncoderLayerOptions(c.hidden_size, c.num_attention_heads, c.intermediate_size)
      .layout(HubLayout::vit)
      .activation(c.hidden_act)
      .hidden_dropout(c.hidden_dropout_prob)
      .attention_dropout(c.attention_probs_dropout_prob)
      .layer_norm_eps(c.layer_norm_eps)
      .initializer_range(c.initializer_range)
      .qkv_bias(c.qkv_bias);
}

DTRAIN_INLINE ViTModelImpl::ViTModelImpl(const Config& c) : config(c) {
  embeddings = register_module("embeddings", ViTEmbeddings(c));
  layer = detail::hub_node(*this, "encoder")->register_module("layer", torch::nn::ModuleList());
  for (std::int64_t i = 0; i < c.num_hidden_layers; ++i) layer->push_back(ViTLayer(c));
  layernorm = detail::hub_norm(*this, "layernorm", c.hidden_size, c.layer_norm_eps);
}

DTRAIN_INLINE torch::Tensor ViTModelImpl::forward(const torch::Tensor& pixel_values) {
  auto x = embeddings(pixel_values);
  for (const auto& l : *layer) x = l->as<ViTLayerImpl>()->forward(x);
  return detail::apply(layernorm, x, config.layer_norm_eps);
}

DTRAIN_INLINE ViTForImageClassificationImpl::ViTForImageClassificationImpl(const Config& c) : config(c) {
  vit = register_module("vit", ViTModel(c));
  classifier = detail::hub_linear(*this, "classifier", c.hidden_size, c.num_labels(), c.initializer_range);
}
}  // namespace nn
DTRAIN_NAMESPACE_END
