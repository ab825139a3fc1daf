// SPDX-License-Identifier: Apache-2.0
#pragma once
// nn::cross_entropy_fp32: the loss of a model with half-precision logits, computed in fp32, as
// Python's `F.cross_entropy(logits.float(), target)` is, without that line's fp32 copy.
//
// Why: a language model's logits ([tokens, vocabulary]) are its largest activation. Written as in
// Python, the fp32 copy is one pass that reads the half logits and writes twice their bytes, the
// log-softmax reads it again, and backward casts the fp32 gradient back: passes over the largest
// tensor that do no arithmetic, and an fp32 copy held at the forward's peak. For fp16 logits on
// CUDA, ATen's log-softmax reads them and writes fp32 log-probabilities itself (its half_to_float
// mode) and its backward writes the fp16 gradient, so those passes and that copy go. ATen's kernel
// takes fp16 only (bf16 is refused: "conversion is supported for Half type only", seen on an H200
// with torch 2.11), so bf16 logits, and any logits on the CPU, take the copying form. The
// arithmetic is fp32's either way; results equal the copying form's within rounding (the row is
// summed in another order), not bitwise.

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
  if (logits.scalar_type() == torch::kHalf && logits.is_cuda()) {
    const auto log_probs = at::_log_softmax(logits, /*dim=*/1, /*half_to_float=*/true);
    return at::nll_loss(log_probs, target, /*weight=*/{}, at::Reduction::Mean, ignore_index);
  }
  return torch::nn::functional::cross_entropy(
      logits.to(torch::kFloat), target, torch::nn::functional::CrossEntropyFuncOptions().ignore_index(ignore_index));
}

}  // namespace nn

DTRAIN_NAMESPACE_END
