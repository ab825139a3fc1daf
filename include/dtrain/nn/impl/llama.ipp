// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of llama.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <cmath>

#include <dtrain/nn/llama.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace nn {


DTRAIN_INLINE LlamaAttentionImpl::LlamaAttentionImpl(const LlamaConfig& c, std::int64_t layer_index)
    : config(c), layer_index(layer_index) {
  q_proj = register_module("q_proj", Linear(c.hidden_size, c.num_attention_heads * c.head_dim, c.qkv_bias()));
  k_proj = register_module("k_proj", Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, c.qkv_bias()));
  v_proj = register_module("v_proj", Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, c.qkv_bias()));
  o_proj = register_module("o_proj", Linear(c.num_attention_heads * c.head_dim, c.hidden_size, c.o_bias()));
}

DTRAIN_INLINE torch::Tensor LlamaAttentionImpl::forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                                                        const DecoderMask& mask, KVCache* cache) {
  const auto batch = x.size(0), tokens = x.size(1), width = config.head_dim;
  const auto heads = [&](Linear& proj, std::int64_t n) { return proj(x).view({batch, tokens, n, width}).transpose(1, 2); };
  auto q = apply_rope(heads(q_proj, config.num_attention_heads), cos, sin);
  auto k = apply_rope(heads(k_proj, config.num_key_value_heads), cos, sin);
  auto v = heads(v_proj, config.num_key_value_heads);
  if (cache) std::tie(k, v) = cache->append(static_cast<std::size_t>(layer_index), k, v);
  const auto out = decoder_attention(q, k, v, mask, 1.0 / std::sqrt(static_cast<double>(width)), config.attention_dropout,
                                     is_training());
  return o_proj(out);
}

DTRAIN_INLINE LlamaMLPImpl::LlamaMLPImpl(const LlamaConfig& c) : act(c.hidden_act) {
  gate_proj = register_module("gate_proj", Linear(c.hidden_size, c.intermediate_size, c.mlp_bias));
  up_proj = register_module("up_proj", Linear(c.hidden_size, c.intermediate_size, c.mlp_bias));
  down_proj = register_module("down_proj", Linear(c.intermediate_size, c.hidden_size, c.mlp_bias));
}

DTRAIN_INLINE torch::Tensor LlamaMLPImpl::forward(const torch::Tensor& x) {
  return down_proj(detail::hub_activation(act, gate_proj(x)) * up_proj(x));
}

DTRAIN_INLINE LlamaDecoderLayerImpl::LlamaDecoderLayerImpl(const LlamaConfig& c, std::int64_t layer_index) {
  self_attn = register_module("self_attn", LlamaAttention(c, layer_index));
  mlp = register_module("mlp", LlamaMLP(c));
  input_layernorm = register_module("input_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps));
  post_attention_layernorm = register_module("post_attention_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps));
}

DTRAIN_INLINE torch::Tensor LlamaDecoderLayerImpl::forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                                                           const DecoderMask& mask, KVCache* cache) {
  const auto h = x + self_attn(input_layernorm(x), cos, sin, mask, cache);
  return h + mlp(post_attention_layernorm(h));
}

DTRAIN_INLINE LlamaModelImpl::LlamaModelImpl(const Config& c) : config(c) {
  embed_tokens = register_module("embed_tokens", torch::nn::Embedding(c.vocab_size, c.hidden_size));
  layers = register_module("layers", torch::nn::ModuleList());
  for (std::int64_t i = 0; i < c.num_hidden_layers; ++i) layers->push_back(LlamaDecoderLayer(c, i));
  norm = register_module("norm", RMSNorm(c.hidden_size, c.rms_norm_eps));
  inverse_frequencies = rope_inverse_frequencies(c.head_dim, c.rope_theta, c.rope_type, c.rope_factor, c.low_freq_factor,
                                                 c.high_freq_factor, c.original_max_position_embeddings);
  detail::init_decoder_weights(*this, c.initializer_range);
}

DTRAIN_INLINE torch::Tensor LlamaModelImpl::forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                                                    const torch::Tensor& position_ids, KVCache* cache) {
  if (input_ids.dim() != 2)
    throw ConfigError("nn::LlamaModel: input_ids must be [batch, tokens], got " + std::to_string(input_ids.dim()) + " dimensions");
  const auto batch = input_ids.size(0), tokens = input_ids.size(1);
  const auto past = cache ? cache->length() : 0;
  auto h = embed_tokens(input_ids);
  const auto positions = position_ids.defined() ? position_ids : decoder_positions({}, batch, tokens, past, h.device());
  const auto [cos, sin] = rope_cos_sin(inverse_frequencies, positions, h.scalar_type());
  // Packed rows (positions restarting, no attention_mask): each document attends to itself alone.
  const auto documents = position_ids.defined() && !attention_mask.defined() && !cache ? packed_documents(position_ids) : torch::Tensor();
  // One mask for the full layers, one for the sliding ones (Mistral, Qwen2), each built once.
  std::optional<DecoderMask> full, sliding;
  for (std::int64_t i = 0; i < static_cast<std::int64_t>(layers->size()); ++i) {
    const auto window = config.window_of(i);
    auto& mask = window ? sliding : full;
    if (!mask) mask = decoder_mask(attention_mask, batch, tokens, past, window, h.scalar_type(), h.device(), documents);
    auto layer = layers->ptr<LlamaDecoderLayerImpl>(static_cast<std::size_t>(i));
    if (gradient_checkpointing && is_training() && !cache)  // backward calls it again: it holds copies
      h = recompute_in_backward(*layer, [layer, c = cos, s = sin, m = *mask](const torch::Tensor& x) { return layer->forward(x, c, s, m, nullptr); }, h);
    else
      h = layer->forward(h, cos, sin, *mask, cache);
  }
  return norm(h);
}

DTRAIN_INLINE LlamaForCausalLMImpl::LlamaForCausalLMImpl(const Config& c) : config(c) {
  model = register_module("model", LlamaModel(c));
  if (!c.tie_word_embeddings) {
    lm_head = register_module("lm_head", Linear(c.hidden_size, c.vocab_size, false));
    detail::init_decoder_weights(*lm_head, c.initializer_range);
  }
}

DTRAIN_INLINE torch::Tensor LlamaForCausalLMImpl::forward(const TokenInputs& inputs, const torch::Tensor& attention_mask,
                                                          const torch::Tensor& position_ids, KVCache* cache) {
  const auto h = model(inputs.input_ids, TokenInputs::either(attention_mask, inputs.attention_mask),
                       TokenInputs::either(position_ids, inputs.position_ids), cache);
  return lm_head ? lm_head(h) : at::linear(h, head_weight());
}

DTRAIN_INLINE torch::Tensor LlamaForCausalLMImpl::next_token_logits(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                                                                    const torch::Tensor& position_ids, KVCache& cache) {
  const auto h = model(input_ids, attention_mask, position_ids, &cache);
  const auto last = h.select(1, h.size(1) - 1);
  return lm_head ? lm_head(last) : at::linear(last, head_weight());
}

}  // namespace nn
DTRAIN_NAMESPACE_END
