// SPDX-License-Identifier: Apache-2.0
#pragma once
// Activation checkpointing (PyTorch's torch.utils.checkpoint, transformers'
// gradient_checkpointing_enable): a block's forward runs without keeping its activations, and
// backward runs it again to differentiate it. Peak memory then holds one block's activations and
// each block's input instead of every block's activations, for one more forward of each block.
//
//   h = dtrain::nn::recompute_in_backward(*layer, [&](const torch::Tensor& x) { return layer->forward(x, ...); }, h);
//
// The decoder families use it per layer: model->gradient_checkpointing_enable() (nn/llama.hpp,
// nn/gpt2.hpp). The recomputation draws the same random numbers (dropout, LoRA's dropout: the CPU
// generator's and the input's device generator's states are restored for it) under the same
// autocast, so outputs and gradients equal the plain run's.

#include <functional>

#include <torch/nn/module.h>
#include <torch/types.h>

#include <dtrain/version.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace nn {

/// fn(x), without keeping fn's activations for backward: backward computes fn(x) again with the
/// saved x and differentiates that. `module` holds the parameters fn reads (its trainable ones get
/// their gradients); what else fn reads must not need a gradient. Outside grad mode, or when
/// neither x nor a parameter of `module` needs a gradient, this is fn(x).
torch::Tensor recompute_in_backward(const torch::nn::Module& module, std::function<torch::Tensor(const torch::Tensor&)> fn,
                                    const torch::Tensor& x);

}  // namespace nn

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/nn/impl/recompute.ipp>
#endif
