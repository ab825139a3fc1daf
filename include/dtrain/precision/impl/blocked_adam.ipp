// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of blocked_adam.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <algorithm>
#include <cmath>

#include <dtrain/precision/blocked_adam.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace precision::detail {

/// Adam (`decoupled_weight_decay` false: the decay joins the gradient) or AdamW (true: the
/// parameter decays), as LibTorch's step() computes them, block by block. Creates missing state
/// as step() does.
template <class Optimizer, class Options, class State>
inline void blocked_adam(Optimizer& opt, bool decoupled_weight_decay) {
  torch::NoGradGuard no_grad;
  for (auto& group : opt.param_groups()) {
    const auto& o = static_cast<const Options&>(group.options());
    const auto [beta1, beta2] = o.betas();
    const double lr = o.lr(), decay = o.weight_decay(), eps = o.eps();
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      auto& state = adam_state<State>(opt, p, o.amsgrad());
      state.step(state.step() + 1);
      const double bias_correction1 = 1 - std::pow(beta1, state.step());
      const double bias_correction2 = 1 - std::pow(beta2, state.step());
      const double step_size = lr / bias_correction1;
      const auto param = p.detach().view({-1}), grad = p.grad().view({-1});
      const auto exp_avg = state.exp_avg().view({-1}), exp_avg_sq = state.exp_avg_sq().view({-1});
      const auto max_exp_avg_sq = o.amsgrad() ? state.max_exp_avg_sq().view({-1}) : at::Tensor();
      const std::int64_t n = param.numel();
      for (std::int64_t from = 0; from < n; from += adam_block) {
        const auto len = std::min(adam_block, n - from);
        auto w = param.narrow(0, from, len), g = grad.narrow(0, from, len);
        auto m = exp_avg.narrow(0, from, len), v = exp_avg_sq.narrow(0, from, len);
        if (decay != 0) {
          if (decoupled_weight_decay) w.mul_(1 - lr * decay);
          else g = g.add(w, decay);
        }
        m.mul_(beta1).add_(g, 1 - beta1);
        v.mul_(beta2).addcmul_(g, g, 1 - beta2);
        at::Tensor denom;
        if (o.amsgrad()) {
          auto most = max_exp_avg_sq.narrow(0, from, len);
          torch::max_out(most, v, most);
          denom = (most.sqrt() / std::sqrt(bias_correction2)).add_(eps);
        } else {
          denom = (v.sqrt() / std::sqrt(bias_correction2)).add_(eps);
        }
        w.addcdiv_(m, denom, -step_size);
      }
    }
  }
}

DTRAIN_INLINE bool step_in_blocks(torch::optim::Adam& opt) {
  if (!blockable<torch::optim::AdamParamState>(opt)) return false;
  blocked_adam<torch::optim::Adam, torch::optim::AdamOptions, torch::optim::AdamParamState>(opt, false);
  return true;
}

DTRAIN_INLINE bool step_in_blocks(torch::optim::AdamW& opt) {
  if (!blockable<torch::optim::AdamWParamState>(opt)) return false;
  blocked_adam<torch::optim::AdamW, torch::optim::AdamWOptions, torch::optim::AdamWParamState>(opt, true);
  return true;
}

}  // namespace precision::detail
DTRAIN_NAMESPACE_END
