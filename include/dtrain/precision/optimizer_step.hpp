// SPDX-License-Identifier: Apache-2.0
#pragma once
// The optimizer step behind ctx.step(opt). torch::optim::SGD, Adam and AdamW whose parameters sit
// on one CUDA device take ATen's fused multi-tensor kernels (_fused_sgd_, _fused_adam_,
// _fused_adamw_; LibTorch 2.3 and later): a few launches for the whole model where opt.step()
// launches several per parameter. Python's `fused=True`. Adam and AdamW on the CPU step block by
// block, in cache (blocked_adam.hpp; bitwise opt.step()'s). Every other optimizer, device, layout
// or LibTorch steps through opt.step().
//
// The fused path reads and writes the optimizer's own state (momentum buffers; Adam's moments and
// step counts) in place, created as opt.step() creates it, so state_dict, checkpoints and a later
// plain opt.step() continue from what it left. The update is opt.step()'s formula computed in one
// kernel: equal within rounding (float32 opmath), not bitwise.

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <type_traits>
#include <typeinfo>
#include <vector>

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <dtrain/detail/torch_compat.hpp>
#include <dtrain/precision/blocked_adam.hpp>

#if DTRAIN_TORCH_AT_LEAST(2, 3)  // compat::fused_optimizers
#include <ATen/ops/_fused_adam.h>
#include <ATen/ops/_fused_adamw.h>
#include <ATen/ops/_fused_sgd.h>
#endif

DTRAIN_NAMESPACE_BEGIN

namespace precision {

/// Whether ctx.step can fuse optimizer steps with this LibTorch.
inline constexpr bool fused_optimizer_steps = compat::fused_optimizers;

namespace detail {

#if DTRAIN_TORCH_AT_LEAST(2, 3)  // compat::fused_optimizers
// Whether every parameter with a gradient in every group can take a fused kernel: one CUDA
// device, one floating dtype, dense contiguous gradients of the parameter's dtype. One that cannot
// sends the whole step to opt.step(), which handles every case.
inline bool fusable(torch::optim::Optimizer& opt) {
  std::optional<at::Device> device;
  std::optional<at::ScalarType> dtype;
  for (auto& group : opt.param_groups())
    for (const auto& p : group.params()) {
      const auto& g = p.grad();
      if (!g.defined()) continue;
      if (!p.is_cuda() || g.is_sparse() || !at::isFloatingType(p.scalar_type()) || g.scalar_type() != p.scalar_type() ||
          !p.is_contiguous() || !g.is_contiguous() || g.device() != p.device())
        return false;
      if (!device) device = p.device(), dtype = p.scalar_type();
      else if (p.device() != *device || p.scalar_type() != *dtype) return false;
    }
  return device.has_value();
}

inline void fused_sgd(torch::optim::SGD& opt) {
  for (auto& group : opt.param_groups()) {
    const auto& o = static_cast<const torch::optim::SGDOptions&>(group.options());
    // [0]: parameters with a momentum buffer (or no momentum); [1]: their first step, whose
    // buffer the kernel starts as the gradient (opt.step() clones it).
    std::vector<at::Tensor> params[2], grads[2], buffers[2];
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      int first = 0;
      if (o.momentum() != 0) {
        auto* state = find_state<torch::optim::SGDParamState>(opt, p);
        if (state == nullptr || !state->momentum_buffer().defined() || !state->momentum_buffer().is_contiguous()) {
          if (state == nullptr) {
            auto fresh = std::make_unique<torch::optim::SGDParamState>();
            state = fresh.get();
            opt.state()[compat::optimizer_state_key(p)] = std::move(fresh);
          }
          state->momentum_buffer(at::empty_like(p.grad(), at::MemoryFormat::Contiguous));
          first = 1;
        }
        buffers[first].push_back(state->momentum_buffer());
      }
      params[first].push_back(p);
      grads[first].push_back(p.grad());
    }
    for (int first : {0, 1})
      if (!params[first].empty())
        at::_fused_sgd_(params[first], grads[first], buffers[first], o.weight_decay(), o.momentum(), o.lr(),
                        o.dampening(), o.nesterov(), /*maximize=*/false, /*is_first_step=*/first == 1);
  }
}

// Adam and AdamW: the same state and kernel arguments; AdamW decays the weights, Adam the gradient.
template <class Optimizer, class Options, class State>
void fused_adam(Optimizer& opt, bool decoupled_weight_decay) {
  for (auto& group : opt.param_groups()) {
    const auto& o = static_cast<const Options&>(group.options());
    // The kernel reads each parameter's step count from a float tensor on the device; parameters
    // are grouped by their count (one in a model whose every parameter steps every time).
    struct Lists {
      std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs;
    };
    std::map<std::int64_t, Lists> by_step;
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      auto* state = &adam_state<State>(opt, p, o.amsgrad());  // contiguous, as p is
      // A state restored from elsewhere may be strided differently: the kernel needs contiguous.
      if (!state->exp_avg().is_contiguous()) state->exp_avg(state->exp_avg().contiguous());
      if (!state->exp_avg_sq().is_contiguous()) state->exp_avg_sq(state->exp_avg_sq().contiguous());
      if (o.amsgrad() && !state->max_exp_avg_sq().is_contiguous())
        state->max_exp_avg_sq(state->max_exp_avg_sq().contiguous());
      state->step(state->step() + 1);
      auto& l = by_step[state->step()];
      l.params.push_back(p);
      l.grads.push_back(p.grad());
      l.exp_avgs.push_back(state->exp_avg());
      l.exp_avg_sqs.push_back(state->exp_avg_sq());
      if (o.amsgrad()) l.max_exp_avg_sqs.push_back(state->max_exp_avg_sq());
    }
    const auto [beta1, beta2] = o.betas();
    for (auto& [step, l] : by_step) {
      // One fill for the whole list; each parameter reads its own element.
      const auto steps = at::full({static_cast<std::int64_t>(l.params.size())}, static_cast<double>(step),
                                  l.params.front().options().dtype(at::kFloat))
                             .unbind(0);
      if (decoupled_weight_decay)
        at::_fused_adamw_(l.params, l.grads, l.exp_avgs, l.exp_avg_sqs, l.max_exp_avg_sqs, steps, o.lr(), beta1, beta2,
                          o.weight_decay(), o.eps(), o.amsgrad(), /*maximize=*/false);
      else
        at::_fused_adam_(l.params, l.grads, l.exp_avgs, l.exp_avg_sqs, l.max_exp_avg_sqs, steps, o.lr(), beta1, beta2,
                         o.weight_decay(), o.eps(), o.amsgrad(), /*maximize=*/false);
    }
  }
}
#endif

}  // namespace detail

/// One optimizer step as ctx.step takes it: fused kernels where the optimizer is exactly
/// torch::optim::SGD, Adam or AdamW (not a subclass, whose step() may differ) and its parameters
/// can take them; Adam and AdamW over CPU parameters block by block; opt.step() otherwise.
/// Returns whether it took the fused kernels.
template <class Optimizer>
bool optimizer_step(Optimizer& opt) {
#if DTRAIN_TORCH_AT_LEAST(2, 3)  // compat::fused_optimizers
  if constexpr (std::is_base_of_v<torch::optim::Optimizer, Optimizer>) {
    const auto& type = typeid(opt);
    const bool known = type == typeid(torch::optim::SGD) || type == typeid(torch::optim::Adam) ||
                       type == typeid(torch::optim::AdamW);
    if (known && detail::fusable(opt)) {
      torch::NoGradGuard no_grad;
      if (type == typeid(torch::optim::SGD)) {
        detail::fused_sgd(dynamic_cast<torch::optim::SGD&>(opt));
      } else if (type == typeid(torch::optim::Adam)) {
        detail::fused_adam<torch::optim::Adam, torch::optim::AdamOptions, torch::optim::AdamParamState>(
            dynamic_cast<torch::optim::Adam&>(opt), false);
      } else {
        detail::fused_adam<torch::optim::AdamW, torch::optim::AdamWOptions, torch::optim::AdamWParamState>(
            dynamic_cast<torch::optim::AdamW&>(opt), true);
      }
      return true;
    }
  }
#endif
  if constexpr (std::is_same_v<Optimizer, torch::optim::Adam> || std::is_same_v<Optimizer, torch::optim::AdamW>)
    if (typeid(opt) == typeid(Optimizer) && detail::step_in_blocks(opt)) return false;
  opt.step();
  return false;
}

}  // namespace precision

DTRAIN_NAMESPACE_END
