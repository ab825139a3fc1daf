// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of encoder.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/nn/encoder.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace nn {

DTRAIN_INLINE torch::Tensor attend(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                   const torch::Tensor& mask, double dropout, bool training) {
  auto scores = at::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(q.size(-1))));
  if (mask.defined()) scores = scores + mask;
  auto weights = at::softmax(scores, -1);
  if (dropout > 0 && training) weights = at::dropout(weights, dropout, true);
  return at::matmul(weights, v);
}

DTRAIN_INLINE SelfAttentionImpl::SelfAttentionImpl(std::int64_t d_model, std::int64_t heads) : heads(heads) {
  if (d_model <= 0 || heads <= 0 || d_model % heads != 0)
    throw ConfigError("nn::EncoderLayer: d_model " + std::to_string(d_model) + " must be a positive multiple of heads " +
                      std::to_string(heads));
  in_proj_weight = register_parameter("in_proj_weight", torch::empty({3 * d_model, d_model}));
  in_proj_bias = register_parameter("in_proj_bias", torch::zeros({3 * d_model}));
  out_proj = register_module("out_proj", torch::nn::Linear(d_model, d_model));
  // torch::nn::MultiheadAttention's initialisation.
  torch::nn::init::xavier_uniform_(in_proj_weight);
  torch::nn::init::zeros_(out_proj->bias);
}

DTRAIN_INLINE torch::Tensor SelfAttentionImpl::forward(const torch::Tensor& x, const torch::Tensor& mask, double dropout) {
  const auto b = x.size(0), s = x.size(1), d = x.size(2);
  const auto qkv = at::linear(x, in_proj_weight, in_proj_bias).view({b, s, 3, heads, d / heads}).permute({2, 0, 3, 1, 4});
  const auto heads_out = attend(qkv[0], qkv[1], qkv[2], mask, dropout, is_training());
  return at::linear(heads_out.transpose(1, 2).reshape({b, s, d}), out_proj->weight, out_proj->bias);
}

DTRAIN_INLINE torch::Tensor SelfAttentionImpl::forward_packed(const torch::Tensor& x, const PackedTokens& packing, double dropout) {
  const auto t = x.size(0), d = x.size(1);
  const auto qkv = at::linear(x, in_proj_weight, in_proj_bias).view({t, 3, heads, d / heads});
  const auto heads_out = attend_packed(qkv.select(1, 0), qkv.select(1, 1), qkv.select(1, 2), packing.offsets, dropout,
                                       is_training());
  return at::linear(heads_out.view({t, d}), out_proj->weight, out_proj->bias);
}

DTRAIN_INLINE torch::Tensor padding_mask(const torch::Tensor& padding, at::ScalarType dtype) {
  if (!padding.defined()) return {};
  if (padding.dim() != 2)
    throw ConfigError("nn::padding_mask: the padding mask must be [batch, sequence], got " +
                      std::to_string(padding.dim()) + " dimensions");
  return at::zeros({padding.size(0), 1, 1, padding.size(1)}, padding.options().dtype(dtype))
      .masked_fill_(padding.to(at::kBool).view({padding.size(0), 1, 1, padding.size(1)}),
                    -std::numeric_limits<double>::infinity());
}

DTRAIN_INLINE EncoderLayerImpl::EncoderLayerImpl(EncoderLayerOptions o) : options(o) {
  self_attn = register_module("self_attn", SelfAttention(o.d_model(), o.heads()));
  linear1 = register_module("linear1", torch::nn::Linear(o.d_model(), o.feedforward()));
  linear2 = register_module("linear2", torch::nn::Linear(o.feedforward(), o.d_model()));
  norm1 = register_module("norm1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.d_model()}).eps(o.layer_norm_eps())));
  norm2 = register_module("norm2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.d_model()}).eps(o.layer_norm_eps())));
}

DTRAIN_INLINE torch::Tensor EncoderLayerImpl::forward(const torch::Tensor& x, const torch::Tensor& mask) {
  if (x.dim() != 3 || x.size(2) != options.d_model())
    throw ConfigError("nn::EncoderLayer: the input must be [batch, sequence, " + std::to_string(options.d_model()) +
                      "] (batch first), got " + std::to_string(x.dim()) + " dimensions" +
                      (x.dim() == 3 ? " with " + std::to_string(x.size(2)) + " features" : std::string()));
  return layer(x, mask);
}

DTRAIN_INLINE torch::Tensor EncoderLayerImpl::forward_packed(const torch::Tensor& x, const PackedTokens& packing) {
  if (x.dim() != 2 || x.size(0) != packing.tokens() || x.size(1) != options.d_model())
    throw ConfigError("nn::EncoderLayer: packed input must be [" + std::to_string(packing.tokens()) + " tokens, " +
                      std::to_string(options.d_model()) + "], got " + std::to_string(x.dim()) + " dimensions");
  return layer(x, packing);
}

DTRAIN_INLINE torch::Tensor EncoderLayerImpl::drop(const torch::Tensor& t) {
  return options.dropout() > 0 && is_training() ? at::dropout(t, options.dropout(), true) : t;
}

DTRAIN_INLINE torch::Tensor EncoderLayerImpl::feedforward(const torch::Tensor& x) {
  auto h = at::linear(x, linear1->weight, linear1->bias);
  h = options.activation() == Activation::gelu ? at::gelu(h) : at::relu(h);
  return at::linear(drop(h), linear2->weight, linear2->bias);
}

DTRAIN_INLINE EncoderImpl::EncoderImpl(EncoderLayerOptions o, std::int64_t count) {
  layers = register_module("layers", torch::nn::ModuleList());
  for (std::int64_t i = 0; i < count; ++i) layers->push_back(EncoderLayer(o));
}

DTRAIN_INLINE torch::Tensor EncoderImpl::forward(torch::Tensor x, const torch::Tensor& padding) {
  if (packs(x, padding)) {
    const auto packing = PackedTokens::of(padding);
    auto t = packing.pack(x);
    for (const auto& layer : *layers) t = layer->as<EncoderLayerImpl>()->forward_packed(t, packing);
    return packing.unpack(t);
  }
  const auto mask = padding_mask(padding, x.scalar_type());
  for (const auto& layer : *layers) x = layer->as<EncoderLayerImpl>()->forward(x, mask);
  return x;
}

namespace detail {

DTRAIN_INLINE torch::nn::Linear hub_linear(torch::nn::Module& parent, const std::string& name, std::int64_t in, std::int64_t out,
                                           double initializer_range, bool bias) {
  auto l = parent.register_module(name, torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias)));
  torch::NoGradGuard no_grad;
  l->weight.normal_(0, initializer_range);
  if (bias) l->bias.zero_();
  return l;
}

DTRAIN_INLINE torch::nn::LayerNorm hub_norm(torch::nn::Module& parent, const std::string& name, std::int64_t width, double eps) {
  return parent.register_module(name, torch::nn::LayerNorm(torch::nn::LayerNormOptions({width}).eps(eps)));
}

DTRAIN_INLINE torch::Tensor apply(const torch::nn::LayerNorm& n, const torch::Tensor& x, double eps) {
  return at::layer_norm(x, {x.size(-1)}, n->weight, n->bias, eps);
}
}  // namespace detail

DTRAIN_INLINE HubEncoderLayerImpl::HubEncoderLayerImpl(HubEncoderLayerOptions o) : options(std::move(o)) {
  const auto h = options.hidden();
  const double range = options.initializer_range();
  if (h <= 0 || options.heads() <= 0 || h % options.heads() != 0 || options.intermediate() <= 0)
    throw ConfigError("nn::HubEncoderLayer: hidden " + std::to_string(h) + " must be a positive multiple of heads " +
                      std::to_string(options.heads()) + ", and intermediate " + std::to_string(options.intermediate()) +
                      " positive");
  if (!hub_activation_supported(options.activation()))
    throw ConfigError("nn::HubEncoderLayer: activation \"" + options.activation() +
                      "\" is not computed here (gelu, gelu_new, gelu_pytorch_tanh, relu)");
  const bool bert = options.layout() == HubLayout::bert;
  auto attention = detail::hub_node(*this, "attention");
  auto self = detail::hub_node(*attention, bert ? "self" : "attention");
  query = detail::hub_linear(*self, "query", h, h, range, options.qkv_bias());
  key = detail::hub_linear(*self, "key", h, h, range, options.qkv_bias());
  value = detail::hub_linear(*self, "value", h, h, range, options.qkv_bias());
  auto attention_output = detail::hub_node(*attention, "output");
  attention_dense = detail::hub_linear(*attention_output, "dense", h, h, range);
  if (bert) attention_norm = detail::hub_norm(*attention_output, "LayerNorm", h, options.layer_norm_eps());
  intermediate = detail::hub_linear(*detail::hub_node(*this, "intermediate"), "dense", h, options.intermediate(), range);
  auto output = detail::hub_node(*this, "output");
  output_dense = detail::hub_linear(*output, "dense", options.intermediate(), h, range);
  if (bert) {
    output_norm = detail::hub_norm(*output, "LayerNorm", h, options.layer_norm_eps());
  } else {
    attention_norm = detail::hub_norm(*this, "layernorm_before", h, options.layer_norm_eps());
    output_norm = detail::hub_norm(*this, "layernorm_after", h, options.layer_norm_eps());
  }
}

DTRAIN_INLINE torch::Tensor HubEncoderLayerImpl::forward_packed(const torch::Tensor& x, const PackedTokens& packing) {
  if (x.dim() != 2 || x.size(0) != packing.tokens() || x.size(1) != options.hidden())
    throw ConfigError("nn::HubEncoderLayer: packed input must be [" + std::to_string(packing.tokens()) + " tokens, " +
                      std::to_string(options.hidden()) + "], got " + std::to_string(x.dim()) + " dimensions");
  return layer(x, packing);
}

DTRAIN_INLINE torch::Tensor HubEncoderLayerImpl::drop(const torch::Tensor& t) {
  const double p = options.hidden_dropout();
  return p > 0 && is_training() ? at::dropout(t, p, true) : t;
}

DTRAIN_INLINE torch::Tensor HubEncoderLayerImpl::self_attention(const torch::Tensor& x, const torch::Tensor& mask) {
  const auto b = x.size(0), s = x.size(1), heads = options.heads(), width = options.hidden() / heads;
  const auto split = [&](const torch::nn::Linear& l) {  // [batch, heads, sequence, width]
    return detail::apply(l, x).view({b, s, heads, width}).transpose(1, 2);
  };
  const auto context = attend(split(query), split(key), split(value), mask, options.attention_dropout(), is_training());
  return detail::apply(attention_dense, context.transpose(1, 2).reshape({b, s, options.hidden()}));
}

DTRAIN_INLINE torch::Tensor HubEncoderLayerImpl::self_attention(const torch::Tensor& x, const PackedTokens& packing) {
  const auto t = x.size(0), heads = options.heads();
  const auto split = [&](const torch::nn::Linear& l) { return detail::apply(l, x).view({t, heads, options.hidden() / heads}); };
  const auto context = attend_packed(split(query), split(key), split(value), packing.offsets, options.attention_dropout(),
                                     is_training());
  return detail::apply(attention_dense, context.view({t, options.hidden()}));
}

DTRAIN_INLINE torch::Tensor HubEncoderLayerImpl::feedforward(const torch::Tensor& x) {
  auto f = detail::apply(intermediate, x);
  const auto& act = options.activation();
  if (act == "gelu") f = at::gelu(f);
  else if (act == "relu") f = at::relu(f);
  else f = at::gelu(f, "tanh");  // gelu_new, gelu_pytorch_tanh
  return detail::apply(output_dense, f);
}
}  // namespace nn
DTRAIN_NAMESPACE_END
