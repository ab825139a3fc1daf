// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of generate.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <limits>
#include <string>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <dtrain/nn/generate.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace nn {
namespace detail {

DTRAIN_INLINE torch::Tensor generate_tokens(const DecoderStep& step, const torch::Tensor& input_ids,
                                            const torch::Tensor& attention_mask, const GenerationOptions& o) {
  const auto bad = [](const std::string& what) { return ConfigError("nn::generate: " + what); };
  if (input_ids.dim() != 2 || input_ids.scalar_type() != torch::kLong || input_ids.size(1) == 0)
    throw bad("input_ids must be [batch, prompt tokens] of int64 with at least one token, got " +
              std::to_string(input_ids.dim()) + " dimensions of " + std::string(c10::toString(input_ids.scalar_type())));
  if (attention_mask.defined() && !attention_mask.sizes().equals(input_ids.sizes()))
    throw bad("attention_mask must be the prompt's shape [batch, prompt tokens]");
  if (o.max_new_tokens < 0) throw bad("max_new_tokens is " + std::to_string(o.max_new_tokens) + "; it must be 0 or more");
  if (o.do_sample && !(o.temperature > 0)) throw bad("temperature must be positive when sampling, got " + std::to_string(o.temperature));
  if (o.do_sample && !(o.top_p > 0 && o.top_p <= 1)) throw bad("top_p must be in (0, 1], got " + std::to_string(o.top_p));
  if (o.top_k < 0) throw bad("top_k must be 0 (off) or positive, got " + std::to_string(o.top_k));

  torch::NoGradGuard no_grad;
  const auto device = input_ids.device();
  const auto batch = input_ids.size(0);
  const std::int64_t pad = o.pad_token_id.value_or(o.eos_token_ids.empty() ? 0 : o.eos_token_ids.front());
  auto mask = attention_mask.defined() ? attention_mask.to(device).to(torch::kLong) : torch::Tensor();
  // Without padding the decoder needs no mask at all (its fused causal path).
  if (mask.defined() && mask.eq(1).all().item<bool>()) mask = torch::Tensor();
  auto generator = at::detail::createCPUGenerator(o.seed);
  KVCache cache;
  auto sequences = input_ids;
  auto next_input = input_ids;
  auto unfinished = at::ones({batch}, torch::TensorOptions().dtype(torch::kBool).device(device));
  for (std::int64_t i = 0; i < o.max_new_tokens; ++i) {
    const auto positions = decoder_positions(mask, batch, next_input.size(1), cache.length(), device);
    auto scores = step(next_input, mask, positions, cache).to(torch::kFloat);
    torch::Tensor next;
    if (!o.do_sample) {
      next = scores.argmax(-1);
    } else {
      const double minus_inf = -std::numeric_limits<double>::infinity();
      if (o.temperature != 1.0) scores = scores / o.temperature;
      if (o.top_k > 0 && o.top_k < scores.size(-1)) {
        const auto kth = std::get<0>(scores.topk(o.top_k, -1)).narrow(-1, o.top_k - 1, 1);
        scores = scores.masked_fill(scores < kth, minus_inf);
      }
      if (o.top_p < 1.0) {
        const auto [sorted, order] = scores.sort(-1, false);  // ascending, as transformers' TopPLogitsWarper
        auto remove = sorted.softmax(-1).cumsum(-1) <= (1 - o.top_p);
        remove.narrow(-1, remove.size(-1) - 1, 1).fill_(false);  // the likeliest token always stays
        scores = scores.masked_fill(remove.scatter(-1, order, remove), minus_inf);
      }
      next = at::multinomial(scores.softmax(-1).to(torch::kCPU), 1, false, generator).squeeze(1).to(device);
    }
    next = at::where(unfinished, next, at::full_like(next, pad));
    sequences = at::cat({sequences, next.unsqueeze(1)}, 1);
    if (mask.defined()) mask = at::cat({mask, at::ones({batch, 1}, mask.options())}, 1);
    for (auto eos : o.eos_token_ids) unfinished = unfinished & next.ne(eos);
    if (!unfinished.any().item<bool>()) break;
    next_input = next.unsqueeze(1);
  }
  return sequences;
}

}  // namespace detail
}  // namespace nn
DTRAIN_NAMESPACE_END
