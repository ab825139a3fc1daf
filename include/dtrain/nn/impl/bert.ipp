// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of bert.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/nn/bert.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace nn {

DTRAIN_INLINE BertEmbeddingsImpl::BertEmbeddingsImpl(const BertConfig& c) : config(c) {
  word_embeddings = register_module("word_embeddings", torch::nn::Embedding(c.vocab_size, c.hidden_size));
  position_embeddings =
      register_module("position_embeddings", torch::nn::Embedding(c.max_position_embeddings, c.hidden_size));
  token_type_embeddings = register_module("token_type_embeddings", torch::nn::Embedding(c.type_vocab_size, c.hidden_size));
  LayerNorm = detail::bert_norm(*this, c);
  torch::NoGradGuard no_grad;
  for (auto* e : {&word_embeddings, &position_embeddings, &token_type_embeddings}) (*e)->weight.normal_(0, c.initializer_range);
  if (c.pad_token_id) word_embeddings->weight[*c.pad_token_id].zero_();
}

DTRAIN_INLINE torch::Tensor BertEmbeddingsImpl::forward(const torch::Tensor& input_ids, const torch::Tensor& token_type_ids) {
  const auto s = input_ids.size(1);
  if (s > config.max_position_embeddings)
    throw ConfigError("nn::BertModel: a sequence of " + std::to_string(s) + " tokens is longer than max_position_embeddings " +
                      std::to_string(config.max_position_embeddings) + "; truncate it");
  const auto positions = torch::arange(s, input_ids.options().dtype(torch::kLong)).unsqueeze(0);
  // nn.Embedding's padding_idx: the padding token's row gets no gradient, as in transformers.
  auto x = at::embedding(word_embeddings->weight, input_ids, config.pad_token_id.value_or(-1));
  x = x + at::embedding(token_type_embeddings->weight,
                        token_type_ids.defined() ? token_type_ids : torch::zeros_like(input_ids));
  x = x + at::embedding(position_embeddings->weight, positions);
  x = detail::apply(LayerNorm, x, config.layer_norm_eps);
  return config.hidden_dropout_prob > 0 && is_training() ? at::dropout(x, config.hidden_dropout_prob, true) : x;
}

DTRAIN_INLINE HubEncoderLayerOptions bert_layer_options(const BertConfig& c) {
  return HubEncoderLayerOptions(c.hidden_size, c.num_attention_heads, c.intermediate_size)
      .layout(HubLayout::bert)
      .activation(c.hidden_act)
      .hidden_dropout(c.hidden_dropout_prob)
      .attention_dropout(c.attention_probs_dropout_prob)
      .layer_norm_eps(c.layer_norm_eps)
      .initializer_range(c.initializer_range);
}

DTRAIN_INLINE torch::Tensor bert_attention_mask(const torch::Tensor& attention_mask, at::ScalarType dtype) {
  if (!attention_mask.defined()) return {};
  if (attention_mask.dim() != 2)
    throw ConfigError("nn::BertModel: attention_mask must be [batch, sequence], got " +
                      std::to_string(attention_mask.dim()) + " dimensions");
  const auto padding = attention_mask.eq(0).view({attention_mask.size(0), 1, 1, attention_mask.size(1)});
  double lowest = std::numeric_limits<float>::lowest();
  if (dtype == at::kDouble) lowest = std::numeric_limits<double>::lowest();
  else if (dtype == at::kHalf) lowest = -65504.0;
  else if (dtype == at::kBFloat16) lowest = -3.3895313892515355e38;
  return at::zeros(padding.sizes(), attention_mask.options().dtype(dtype)).masked_fill_(padding, lowest);
}

DTRAIN_INLINE BertModelImpl::BertModelImpl(const Config& c) : config(c) {
  embeddings = register_module("embeddings", BertEmbeddings(c));
  auto encoder = detail::bert_node(*this, "encoder");
  layer = encoder->register_module("layer", torch::nn::ModuleList());
  for (std::int64_t i = 0; i < c.num_hidden_layers; ++i) layer->push_back(BertLayer(c));
  pooler = detail::bert_linear(*detail::bert_node(*this, "pooler"), "dense", c.hidden_size, c.hidden_size, c);
}

DTRAIN_INLINE BertOutput BertModelImpl::forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                                                const torch::Tensor& token_type_ids) {
  if (input_ids.dim() != 2)
    throw ConfigError("nn::BertModel: input_ids must be [batch, sequence], got " + std::to_string(input_ids.dim()) +
                      " dimensions");
  auto x = embeddings(input_ids, token_type_ids);
  const auto mask = bert_attention_mask(attention_mask, x.scalar_type());
  for (const auto& l : *layer) x = l->as<BertLayerImpl>()->forward(x, mask);
  auto pooled = at::tanh(detail::apply(pooler, x.select(1, 0)));
  return {x, pooled};
}

DTRAIN_INLINE torch::Tensor BertModelImpl::pooled(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                                                  const torch::Tensor& token_type_ids) {
  if (input_ids.dim() != 2 || !attention_mask.defined() || attention_mask.sizes() != input_ids.sizes() ||
      !packs(input_ids, attention_mask.eq(0)) || !attention_mask.select(1, 0).ne(0).all().item<bool>())
    return forward(input_ids, attention_mask, token_type_ids).pooler_output;
  const auto packing = PackedTokens::of(attention_mask.eq(0));
  auto t = packing.pack(embeddings(input_ids, token_type_ids));
  for (const auto& l : *layer) t = l->as<BertLayerImpl>()->forward_packed(t, packing);
  return at::tanh(detail::apply(pooler, t.index_select(0, packing.firsts())));
}

DTRAIN_INLINE BertForSequenceClassificationImpl::BertForSequenceClassificationImpl(const Config& c) : config(c) {
  bert = register_module("bert", BertModel(c));
  classifier = detail::bert_linear(*this, "classifier", c.hidden_size, c.num_labels(), c);
}

DTRAIN_INLINE torch::Tensor BertForSequenceClassificationImpl::forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                                                                       const torch::Tensor& token_type_ids) {
  auto pooled = bert->pooled(input_ids, attention_mask, token_type_ids);
  const double p = config.classifier_dropout.value_or(config.hidden_dropout_prob);
  if (p > 0 && is_training()) pooled = at::dropout(pooled, p, true);
  return detail::apply(classifier, pooled);
}

DTRAIN_INLINE bool is_bert_non_weight(const std::string& key) {
  for (const std::string suffix : {"embeddings.position_ids", "embeddings.token_type_ids"})
    if (key.size() >= suffix.size() && key.compare(key.size() - suffix.size(), suffix.size(), suffix) == 0) return true;
  return false;
}
}  // namespace nn
DTRAIN_NAMESPACE_END
