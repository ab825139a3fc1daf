// SPDX-License-Identifier: Apache-2.0
#pragma once
// nn::cross_entropy_fp32: the loss of a model with half-precision logits, computed in fp32, as
// Python's `F.cross_entropy(logits.float(), target)` is, without that line's fp32 copy.
//
// Why: a language model's logits ([tokens, vocabulary]) are its largest activation. Written as in
// Python, the fp32 copy is one pass that reads the half logits and writes twice their bytes, the
// log-softmax reads it and writes fp32 log-probabilities, and backward writes an fp32 gradient,
// reads it twice and casts it back: passes over the largest tensor that do no arithmetic, and fp32
// copies held at the forward's peak. For fp16 and bf16 logits on CUDA, two kernels do the work
// (detail/cross_entropy_cuda.hpp): forward reads each row once and keeps its max and log-sum-exp,
// backward reads it again and writes the gradient in the logits' dtype. The arithmetic is fp32's;
// results equal the copying form's within rounding (the row is summed in another order), not
// bitwise. Elsewhere (the CPU, fp32 logits, a machine whose NVRTC cannot compile the kernels) the
// copying form runs. The CUDA kernels have no second derivative (backward with create_graph throws),
// and a target outside [0, classes) makes the loss NaN rather than stopping the device as ATen's
// kernel does.

#include <cstdint>
#include <string>
#include <utility>

#include <torch/nn/functional/loss.h>
#include <torch/types.h>

#include <dtrain/detail/cuda.hpp>
#include <dtrain/error.hpp>
// CMake's dtrain target defines DTRAIN_WITH_NVRTC=1 and links NVRTC where CUDA 12's is found; a build
// without CMake defines it and links libnvrtc itself, or leaves it undefined for the copying form.
#if DTRAIN_WITH_CUDA && defined(DTRAIN_WITH_NVRTC) && DTRAIN_WITH_NVRTC
#define DTRAIN_FUSED_CROSS_ENTROPY 1
#include <dtrain/nn/detail/cross_entropy_cuda.hpp>
#else
#define DTRAIN_FUSED_CROSS_ENTROPY 0
#endif

DTRAIN_NAMESPACE_BEGIN

namespace nn {

/// Mean cross entropy of `logits` [N, classes] (any floating dtype) against class indices `target`
/// [N], in fp32; targets equal to `ignore_index` count for nothing (F.cross_entropy's default).
/// Returns an fp32 scalar. Call it inside or outside ctx.autocast(): it decides its dtypes itself.
torch::Tensor cross_entropy_fp32(const torch::Tensor& logits, const torch::Tensor& target,
                                 std::int64_t ignore_index = -100);

/// A causal LM's loss, as transformers computes it from `labels=`: the logits [batch, tokens,
/// vocab] at position t predict labels [batch, tokens] at t + 1 (the shift is done here: pass the
/// labels aligned with input_ids, usually input_ids themselves); labels equal to `ignore_index`
/// (-100: a prompt's tokens, padding) count for nothing; the mean over the rest, in fp32
/// (cross_entropy_fp32). NaN when no label counts, as transformers'.
torch::Tensor causal_lm_loss(const torch::Tensor& logits, const torch::Tensor& labels, std::int64_t ignore_index = -100);

}  // namespace nn

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/nn/impl/loss.ipp>
#endif
