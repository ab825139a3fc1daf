// SPDX-License-Identifier: Apache-2.0
#pragma once
// nn::cross_entropy_fp32: the loss of a model with half-precision logits, computed in fp32, as
// Python's `F.cross_entropy(logits.float(), target)` is, without that line's fp32 copy.
//
// Why: a language model's logits ([tokens, vocabulary]) are its largest activation. Written as in
// Python, the fp32 copy is one pass that reads the half logits and writes twice their bytes, the
// log-softmax reads it again, and backward casts the fp32 gradient back: four passes over the
// largest tensor that do no arithmetic. ATen's log-softmax reads half logits and writes fp32
// log-probabilities itself (its half_to_float mode, CUDA only), and its backward writes the half
// gradient, so those passes go (about 3 % of an H200 step of the GPU benchmark's transformer
// block: docs/gpu.md, finding 7). The arithmetic is fp32's either way; results equal the copying
// form's within rounding (the reduction order differs with the element size), not bitwise.

#include <cstdint>
#include <string>

#include <torch/nn/functional/loss.h>
#include <torch/types.h>

#include <dtrain/error.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace nn {

/// Mean cross entropy of `logits` [N, classes] (any floating dtype) against class indices `target`
/// [N], in fp32; targets equal to `ignore_index` count for nothing (F.cross_entropy's default).
/// Returns an fp32 scalar. Call it inside or outside ctx.autocast(): it decides its dtypes itself.
inline torch::Tensor cross_entropy_fp32(const torch::Tensor& logits, const torch::Tensor& target,
                                        std::int64_t ignore_index = -100) {
  if (logits.dim() != 2 || target.dim() != 1 || target.size(0) != logits.size(0))
    throw ConfigError("nn::cross_entropy_fp32: logits must be [N, classes] and target [N]; got logits " +
                      c10::str(logits.sizes()) + " and target " +
                      c10::str(target.sizes()) +
                      ". A sequence model's logits [B, S, classes] go in as logits.reshape({-1, logits.size(-1)}) "
                      "with target.reshape({-1})");
  const auto dtype = logits.scalar_type();
  const bool half = dtype == torch::kHalf || dtype == torch::kBFloat16;
  if (half && logits.is_cuda()) {
    const auto log_probs = at::_log_softmax(logits, /*dim=*/1, /*half_to_float=*/true);
    return at::nll_loss(log_probs, target, /*weight=*/{}, at::Reduction::Mean, ignore_index);
  }
  return torch::nn::functional::cross_entropy(
      logits.to(torch::kFloat), target, torch::nn::functional::CrossEntropyFuncOptions().ignore_index(ignore_index));
}

}  // namespace nn

DTRAIN_NAMESPACE_END
