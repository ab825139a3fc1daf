// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of gpt2.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <cmath>

#include <dtrain/nn/gpt2.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace nn {

DTRAIN_INLINE GPT2Config GPT2Config::from_json(const nlohmann::json& j, const std::string& source) {
  if (!j.is_object()) throw ConfigError(source + ": a GPT-2 config must be a JSON object, got " + std::string(j.type_name()));
  detail::HubJsonReader r{j, source, {}};
  if (j.contains("model_type") && j["model_type"] != "gpt2")
    throw r.fail("model_type " + j["model_type"].dump() +
                 " is not GPT-2 (nn::GPT2LMHeadModel computes \"gpt2\"; Llama, Mistral and Qwen2 are nn::LlamaForCausalLM)");
  GPT2Config c;
  r.take("vocab_size", c.vocab_size, true);
  r.take("n_embd", c.n_embd, true);
  r.take("n_layer", c.n_layer, true);
  r.take("n_head", c.n_head, true);
  r.take("n_positions", c.n_positions);
  r.take("n_inner", c.n_inner);
  r.take("activation_function", c.activation_function);
  r.take("resid_pdrop", c.resid_pdrop);
  r.take("embd_pdrop", c.embd_pdrop);
  r.take("attn_pdrop", c.attn_pdrop);
  r.take("layer_norm_epsilon", c.layer_norm_epsilon);
  r.take("initializer_range", c.initializer_range);
  r.take("scale_attn_weights", c.scale_attn_weights);
  r.take("scale_attn_by_inverse_layer_idx", c.scale_attn_by_inverse_layer_idx);
  r.take("tie_word_embeddings", c.tie_word_embeddings);
  r.take("bos_token_id", c.bos_token_id);
  r.take("pad_token_id", c.pad_token_id);
  r.take("eos_token_id", c.eos_token_id);
  bool cross = false;
  r.take("add_cross_attention", cross);
  if (cross) throw r.fail("\"add_cross_attention\": true (an encoder-decoder's GPT-2) is not computed here");
  for (const auto& [key, value] : {std::pair{"vocab_size", c.vocab_size}, {"n_embd", c.n_embd}, {"n_head", c.n_head},
                                   {"n_positions", c.n_positions}, {"n_inner", c.inner()}})
    r.at_least(key, value, 1);
  r.at_least("n_layer", c.n_layer, 0);
  if (c.n_embd % c.n_head != 0)
    throw r.fail("\"n_embd\" " + std::to_string(c.n_embd) + " is not a multiple of \"n_head\" " + std::to_string(c.n_head));
  const auto& a = c.activation_function;
  if (a != "gelu_new" && a != "gelu" && a != "gelu_pytorch_tanh" && a != "relu" && a != "silu")
    throw r.fail("\"activation_function\": \"" + a + "\" is not supported (gelu_new, gelu, gelu_pytorch_tanh, relu, silu)");
  // reorder_and_upcast_attn changes fp16 rounding only: attention here is computed in fp32's softmax anyway.
  c.extra = r.rest();
  return c;
}

DTRAIN_INLINE nlohmann::json GPT2Config::to_json() const {
  nlohmann::json j = extra.is_object() ? extra : nlohmann::json::object();
  j["model_type"] = "gpt2";
  j["vocab_size"] = vocab_size;
  j["n_positions"] = n_positions;
  j["n_embd"] = n_embd;
  j["n_layer"] = n_layer;
  j["n_head"] = n_head;
  j["n_inner"] = n_inner ? nlohmann::json(*n_inner) : nlohmann::json(nullptr);
  j["activation_function"] = activation_function;
  j["resid_pdrop"] = resid_pdrop;
  j["embd_pdrop"] = embd_pdrop;
  j["attn_pdrop"] = attn_pdrop;
  j["layer_norm_epsilon"] = layer_norm_epsilon;
  j["initializer_range"] = initializer_range;
  j["scale_attn_weights"] = scale_attn_weights;
  j["scale_attn_by_inverse_layer_idx"] = scale_attn_by_inverse_layer_idx;
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["bos_token_id"] = bos_token_id ? nlohmann::json(*bos_token_id) : nlohmann::json(nullptr);
  j["pad_token_id"] = pad_token_id ? nlohmann::json(*pad_token_id) : nlohmann::json(nullptr);
  j["eos_token_id"] = detail::ids_json(eos_token_id);
  return j;
}

DTRAIN_INLINE GPT2Conv1DImpl::GPT2Conv1DImpl(std::int64_t in, std::int64_t out) {
  weight = register_parameter("weight", torch::empty({in, out}));
  bias = register_parameter("bias", torch::zeros({out}));
}

DTRAIN_INLINE torch::Tensor GPT2Conv1DImpl::forward(const torch::Tensor& x) {
  auto sizes = x.sizes().vec();
  sizes.back() = weight.size(1);
  auto y = at::addmm(bias, x.reshape({-1, x.size(-1)}), weight).view(sizes);
  return has_lora() ? y + lora_delta(x, is_training()) : y;
}

DTRAIN_INLINE GPT2AttentionImpl::GPT2AttentionImpl(const GPT2Config& c, std::int64_t layer_index)
    : config(c), layer_index(layer_index) {
  c_attn = register_module("c_attn", GPT2Conv1D(c.n_embd, 3 * c.n_embd));
  c_proj = register_module("c_proj", GPT2Conv1D(c.n_embd, c.n_embd));
}

DTRAIN_INLINE torch::Tensor GPT2AttentionImpl::forward(const torch::Tensor& x, const DecoderMask& mask, KVCache* cache) {
  const auto batch = x.size(0), tokens = x.size(1), heads = config.n_head, width = config.n_embd / config.n_head;
  const auto qkv = c_attn(x).view({batch, tokens, 3, heads, width}).permute({2, 0, 3, 1, 4});
  auto q = qkv[0], k = qkv[1], v = qkv[2];
  if (cache) std::tie(k, v) = cache->append(static_cast<std::size_t>(layer_index), k, v);
  double scale = config.scale_attn_weights ? 1.0 / std::sqrt(static_cast<double>(width)) : 1.0;
  if (config.scale_attn_by_inverse_layer_idx) scale /= static_cast<double>(layer_index + 1);
  auto out = c_proj(decoder_attention(q, k, v, mask, scale, config.attn_pdrop, is_training()));
  return config.resid_pdrop > 0 && is_training() ? at::dropout(out, config.resid_pdrop, true) : out;
}

DTRAIN_INLINE GPT2BlockImpl::GPT2BlockImpl(const GPT2Config& c, std::int64_t layer_index) : config(c) {
  const auto norm = [&] { return torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.n_embd}).eps(c.layer_norm_epsilon)); };
  ln_1 = register_module("ln_1", norm());
  attn = register_module("attn", GPT2Attention(c, layer_index));
  ln_2 = register_module("ln_2", norm());
  auto mlp = register_module("mlp", std::make_shared<torch::nn::Module>("GPT2MLP"));
  c_fc = mlp->register_module("c_fc", GPT2Conv1D(c.n_embd, c.inner()));
  c_proj = mlp->register_module("c_proj", GPT2Conv1D(c.inner(), c.n_embd));
}

DTRAIN_INLINE torch::Tensor GPT2BlockImpl::forward(const torch::Tensor& x, const DecoderMask& mask, KVCache* cache) {
  const auto h = x + attn(ln_1(x), mask, cache);
  auto m = c_proj(detail::hub_activation(config.activation_function, c_fc(ln_2(h))));
  if (config.resid_pdrop > 0 && is_training()) m = at::dropout(m, config.resid_pdrop, true);
  return h + m;
}

DTRAIN_INLINE GPT2ModelImpl::GPT2ModelImpl(const Config& c) : config(c) {
  wte = register_module("wte", torch::nn::Embedding(c.vocab_size, c.n_embd));
  wpe = register_module("wpe", torch::nn::Embedding(c.n_positions, c.n_embd));
  h = register_module("h", torch::nn::ModuleList());
  for (std::int64_t i = 0; i < c.n_layer; ++i) h->push_back(GPT2Block(c, i));
  ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.n_embd}).eps(c.layer_norm_epsilon)));
  // transformers' init: normal(0, initializer_range), the residual projections' scaled by 1/sqrt(2 n_layer).
  detail::init_decoder_weights(*this, c.initializer_range);
  torch::NoGradGuard no_grad;
  for (auto& p : named_parameters())
    if (p.key().size() > 13 && p.key().compare(p.key().size() - 13, 13, "c_proj.weight") == 0)
      p.value().normal_(0, c.initializer_range / std::sqrt(2.0 * static_cast<double>(std::max<std::int64_t>(c.n_layer, 1))));
}

DTRAIN_INLINE torch::Tensor GPT2ModelImpl::forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                                                   const torch::Tensor& position_ids, KVCache* cache) {
  if (input_ids.dim() != 2)
    throw ConfigError("nn::GPT2Model: input_ids must be [batch, tokens], got " + std::to_string(input_ids.dim()) + " dimensions");
  const auto batch = input_ids.size(0), tokens = input_ids.size(1);
  const auto past = cache ? cache->length() : 0;
  const auto positions =
      position_ids.defined() ? position_ids : decoder_positions({}, batch, tokens, past, input_ids.device());
  if (positions.numel() > 0 && positions.max().item<std::int64_t>() >= config.n_positions)
    throw ConfigError("nn::GPT2Model: position " + std::to_string(positions.max().item<std::int64_t>()) +
                      " is beyond the model's n_positions " + std::to_string(config.n_positions) +
                      "; shorten the sequence (truncate the prompt, fewer new tokens)");
  auto x = wte(input_ids) + wpe(positions);
  if (config.embd_pdrop > 0 && is_training()) x = at::dropout(x, config.embd_pdrop, true);
  // Packed rows (positions restarting, no attention_mask): each document attends to itself alone.
  const auto documents = position_ids.defined() && !attention_mask.defined() && !cache ? packed_documents(position_ids) : torch::Tensor();
  const auto mask = decoder_mask(attention_mask, batch, tokens, past, std::nullopt, x.scalar_type(), x.device(), documents);
  for (std::size_t i = 0; i < h->size(); ++i) {
    auto block = h->ptr<GPT2BlockImpl>(i);
    if (gradient_checkpointing && is_training() && !cache)  // backward calls it again: it holds copies
      x = recompute_in_backward(*block, [block, mask](const torch::Tensor& in) { return block->forward(in, mask, nullptr); }, x);
    else
      x = block->forward(x, mask, cache);
  }
  return ln_f(x);
}

DTRAIN_INLINE GPT2LMHeadModelImpl::GPT2LMHeadModelImpl(const Config& c) : config(c) {
  transformer = register_module("transformer", GPT2Model(c));
  if (!c.tie_word_embeddings) {
    lm_head = register_module("lm_head", Linear(c.n_embd, c.vocab_size, false));
    detail::init_decoder_weights(*lm_head, c.initializer_range);
  }
}

DTRAIN_INLINE torch::Tensor GPT2LMHeadModelImpl::forward(const TokenInputs& inputs, const torch::Tensor& attention_mask,
                                                         const torch::Tensor& position_ids, KVCache* cache) {
  const auto x = transformer(inputs.input_ids, TokenInputs::either(attention_mask, inputs.attention_mask),
                             TokenInputs::either(position_ids, inputs.position_ids), cache);
  return lm_head ? lm_head(x) : at::linear(x, head_weight());
}

DTRAIN_INLINE torch::Tensor GPT2LMHeadModelImpl::next_token_logits(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                                                                   const torch::Tensor& position_ids, KVCache& cache) {
  const auto x = transformer(input_ids, attention_mask, position_ids, &cache);
  const auto last = x.select(1, x.size(1) - 1);
  return lm_head ? lm_head(last) : at::linear(last, head_weight());
}

}  // namespace nn
DTRAIN_NAMESPACE_END
