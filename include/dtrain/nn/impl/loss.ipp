// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of loss.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/nn/loss.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace nn {

DTRAIN_INLINE torch::Tensor cross_entropy_fp32(const torch::Tensor& logits, const torch::Tensor& target,
                                               std::int64_t ignore_index) {
  if (logits.dim() != 2 || target.dim() != 1 || target.size(0) != logits.size(0))
    throw ConfigError("nn::cross_entropy_fp32: logits must be [N, classes] and target [N]; got logits " +
                      c10::str(logits.sizes()) + " and target " +
                      c10::str(target.sizes()) +
                      ". A sequence model's logits [B, S, classes] go in as logits.reshape({-1, logits.size(-1)}) "
                      "with target.reshape({-1})");
#if DTRAIN_FUSED_CROSS_ENTROPY
  if (auto fused = detail::fused_cross_entropy_fp32(logits, target, ignore_index)) return *std::move(fused);
#endif
  return torch::nn::functional::cross_entropy(
      logits.to(torch::kFloat), target, torch::nn::functional::CrossEntropyFuncOptions().ignore_index(ignore_index));
}

DTRAIN_INLINE torch::Tensor causal_lm_loss(const torch::Tensor& logits, const torch::Tensor& labels, std::int64_t ignore_index) {
  if (logits.dim() != 3 || labels.dim() != 2 || labels.size(0) != logits.size(0) || labels.size(1) != logits.size(1))
    throw ConfigError("nn::causal_lm_loss: logits must be [batch, tokens, vocab] and labels [batch, tokens] (aligned with "
                      "input_ids: the shift is done here); got logits " + c10::str(logits.sizes()) + " and labels " +
                      c10::str(labels.sizes()));
  // transformers' ForCausalLMLoss: labels shifted left by one, the last position predicting nothing.
  const auto shifted = at::constant_pad_nd(labels.narrow(1, 1, labels.size(1) - 1), {0, 1}, static_cast<double>(ignore_index));
  return cross_entropy_fp32(logits.reshape({-1, logits.size(-1)}), shifted.reshape({-1}).to(torch::kLong), ignore_index);
}
}  // namespace nn
DTRAIN_NAMESPACE_END
