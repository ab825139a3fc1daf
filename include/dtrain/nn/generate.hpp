// SPDX-License-Identifier: Apache-2.0
#pragma once
// nn::generate: text generation from a causal LM (nn::LlamaForCausalLM, nn::GPT2LMHeadModel, or
// any module with their `next_token_logits` and config ids), greedy or sampled, with a KV cache:
//
//   auto out = dtrain::nn::generate(model, input_ids, attention_mask, {.max_new_tokens = 32});
//   // [batch, prompt + new tokens]: the prompts, then what was generated
//   auto sampled = dtrain::nn::generate(model, input_ids, {}, {.do_sample = true, .temperature = 0.7,
//                                                             .top_k = 50, .top_p = 0.9, .seed = 1});
//
// As transformers' generate(): the prompt is computed once (its keys and values cached), then each
// step computes only its new token; positions count from each row's first token, so left-padded
// prompts (the padding side for generation) continue where their text ends; a row that produced an
// end-of-sequence id gets the pad id from then on, and generation stops when every row has, or
// after max_new_tokens. Greedy picks the highest logit (the first on a tie, as argmax); sampling
// divides by the temperature, keeps the top_k highest and the smallest set whose probability
// reaches top_p (transformers' order and defaults), and draws from a generator seeded with `seed`:
// the same seed gives the same text. Greedy output equals transformers' generate(do_sample=False)
// on the same weights (tests/unit/decoder_test.cpp). Runs without autograd.

#include <cstdint>
#include <functional>
#include <optional>
#include <type_traits>
#include <vector>

#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <dtrain/error.hpp>
#include <dtrain/nn/decoder.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace nn {

struct GenerationOptions {
  /// Tokens generated at most (after the prompt).
  std::int64_t max_new_tokens = 32;
  /// Sample (temperature, top_k, top_p, seed) rather than take the highest logit.
  bool do_sample = false;
  double temperature = 1.0;
  /// Keep the k highest logits when sampling (0: all). transformers' default, 50.
  std::int64_t top_k = 50;
  /// Keep the smallest set of tokens whose probability reaches top_p when sampling (1: all).
  double top_p = 1.0;
  std::uint64_t seed = 0;
  /// Ids that end a sequence (empty: the model config's eos_token_id).
  std::vector<std::int64_t> eos_token_ids = {};
  /// What a finished row gets (none: the config's pad_token_id, else the first end-of-sequence id).
  std::optional<std::int64_t> pad_token_id = std::nullopt;
};

/// A module generate() runs: a decoder with a KV-cached step and its config's special ids.
template <class M>
concept CausalLM = std::is_base_of_v<torch::nn::Module, M> &&
                   requires(M& m, const torch::Tensor& t, KVCache& cache) {
                     { m.next_token_logits(t, t, t, cache) } -> std::same_as<torch::Tensor>;
                     m.config.eos_token_id;
                     m.config.pad_token_id;
                   };

/// One step of a decoder: the next token's logits [batch, vocab] after input_ids [batch, new]
/// with attention_mask [batch, cached + new] (or undefined), positions [batch, new] and the cache.
using DecoderStep = std::function<torch::Tensor(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                                                const torch::Tensor& positions, KVCache& cache)>;

namespace detail {
/// generate()'s loop over any decoder step; `options` complete (eos and pad resolved).
torch::Tensor generate_tokens(const DecoderStep& step, const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                              const GenerationOptions& options);
}  // namespace detail

/// `input_ids` [batch, prompt] (int64) followed by up to options.max_new_tokens generated ids:
/// [batch, prompt + generated]. `attention_mask` [batch, prompt] marks each row's padding (0; left
/// padding, as transformers generates), or is undefined. ConfigError for input that is not
/// [batch, prompt] int64, a mask of another shape, or options out of range (temperature <= 0 when
/// sampling, top_p outside (0, 1], negative top_k or max_new_tokens).
template <class M>
torch::Tensor generate(M& model, const torch::Tensor& input_ids, const torch::Tensor& attention_mask = {},
                       GenerationOptions options = {}) {
  if constexpr (requires { typename M::ContainedType; }) {
    return generate(*model, input_ids, attention_mask, std::move(options));
  } else {
    static_assert(CausalLM<M>,
                  "dtrain::nn::generate(model, ...): the model must be a causal LM with next_token_logits(input_ids, "
                  "attention_mask, positions, KVCache&) and config.eos_token_id / config.pad_token_id "
                  "(nn::LlamaForCausalLM, nn::GPT2LMHeadModel)");
    if (options.eos_token_ids.empty()) options.eos_token_ids = model.config.eos_token_id;
    if (!options.pad_token_id) options.pad_token_id = model.config.pad_token_id;
    return detail::generate_tokens(
        [&model](const torch::Tensor& ids, const torch::Tensor& mask, const torch::Tensor& positions, KVCache& cache) {
          return model.next_token_logits(ids, mask, positions, cache);
        },
        input_ids, attention_mask, options);
  }
}

}  // namespace nn

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/nn/impl/generate.ipp>
#endif
