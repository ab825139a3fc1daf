// SPDX-License-Identifier: Apache-2.0
#pragma once
// The optimizer step inside a CUDA graph (ctx.graphed_step): optimizer_step.hpp's fused kernels,
// with what changes from one replay to the next kept in device memory the graph reads. Each
// group's learning rate is a tensor the host refills before a replay when a scheduler changed it;
// Adam's per-parameter step counts are a buffer the graph itself increments (the host's counts
// in the optimizer's state are advanced alongside, so state_dict and checkpoints stay true).
// Everything else the kernels take (momentum, betas, eps, weight decay...) is baked into the graph
// at capture: a later change is refused, not silently ignored.

#include <cstdint>
#include <string>
#include <typeinfo>
#include <utility>
#include <vector>

#include <dtrain/detail/cuda.hpp>
#include <dtrain/error.hpp>
#include <dtrain/precision/optimizer_step.hpp>

/// Whether ctx.graphed_step can capture steps: a CUDA build of LibTorch 2.3 or later.
#define DTRAIN_CUDA_GRAPHS (DTRAIN_WITH_CUDA && DTRAIN_TORCH_AT_LEAST(2, 3))

DTRAIN_NAMESPACE_BEGIN

namespace precision::detail {

#if DTRAIN_CUDA_GRAPHS
class captured_step {
 public:
  /// Before capture, after the warm-up steps made the optimizer's state and left gradients:
  /// checks that the optimizer can be captured, lists the parameters with a gradient (the ones
  /// the step trains) and allocates the device-side learning rates and step counts.
  explicit captured_step(torch::optim::Optimizer& opt) : opt_(&opt) {
    const auto& type = typeid(opt);
    adam_ = type == typeid(torch::optim::Adam) || type == typeid(torch::optim::AdamW);
    decoupled_ = type == typeid(torch::optim::AdamW);
    if (!fusable(opt))
      throw ConfigError("ctx.graphed_step: the optimizer's parameters cannot take the fused kernels a captured step "
                        "runs (they need one CUDA device, one floating dtype, dense contiguous gradients); "
                        "step this model with ctx.backward and ctx.step instead");
    for (auto& group : opt.param_groups()) {
      Group g;
      for (auto& p : group.params()) {
        if (!p.grad().defined()) continue;
        g.params.push_back(p);
        adam_ ? add_adam_state(g, p) : add_sgd_state(g, p, group);
      }
      g.lr_value = group.options().get_lr();
      g.baked = baked_options(group);
      if (!g.params.empty()) {
        const auto on_device = at::TensorOptions().dtype(at::kFloat).device(g.params.front().device());
        g.lr = at::full({}, g.lr_value, on_device);
        if (adam_) g.steps = at::empty({static_cast<std::int64_t>(g.params.size())}, on_device);
        sync_steps(g);
      }
      groups_.push_back(std::move(g));
    }
  }

  /// Inside the capture, after backward: enqueues the step's kernels. The parameters with a
  /// gradient must be the warm-up's.
  void capture() {
    torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < groups_.size(); ++i) {
      auto& group = opt_->param_groups()[i];
      auto& g = groups_[i];
      std::vector<at::Tensor> grads;
      for (const auto& p : group.params())
        if (p.grad().defined()) grads.push_back(p.grad());
      if (grads.size() != g.params.size())
        throw ConfigError("ctx.graphed_step: group " + std::to_string(i) + " has " + std::to_string(grads.size()) +
                          " parameters with a gradient in the captured step and " + std::to_string(g.params.size()) +
                          " after the warm-up steps; a captured step must train the same parameters every time");
      if (g.params.empty()) continue;
      if (adam_) {
        // Each parameter reads its own element; the graph adds 1 first, as opt.step() counts.
        g.steps.add_(1);
        const auto steps = g.steps.unbind(0);
        with_adam_options(group, [&](const auto& o) {
          const auto [beta1, beta2] = o.betas();
          if (decoupled_)
            at::_fused_adamw_(g.params, grads, g.state[0], g.state[1], g.state[2], steps, g.lr, beta1, beta2,
                              o.weight_decay(), o.eps(), o.amsgrad(), /*maximize=*/false);
          else
            at::_fused_adam_(g.params, grads, g.state[0], g.state[1], g.state[2], steps, g.lr, beta1, beta2,
                             o.weight_decay(), o.eps(), o.amsgrad(), /*maximize=*/false);
        });
      } else {
        const auto& o = static_cast<const torch::optim::SGDOptions&>(group.options());
        at::_fused_sgd_(g.params, grads, g.state[0], o.weight_decay(), o.momentum(), g.lr, o.dampening(),
                        o.nesterov(), /*maximize=*/false, /*is_first_step=*/false);
      }
    }
  }

  /// Whether the tensors the graph updates are still the optimizer's (ctx.checkpoint hands the
  /// state it saved to the writer and gives the optimizer fresh copies; ctx.restore may replace
  /// it): false means capture again.
  bool current() const {
    for (std::size_t i = 0; i < groups_.size(); ++i)
      for (std::size_t k = 0; k < groups_[i].params.size(); ++k)
        for (int s = 0; s < 3; ++s)
          if (!groups_[i].state[s].empty() && !groups_[i].state[s][k].is_same(state_tensor(groups_[i].params[k], s)))
            return false;
    return true;
  }

  /// Before each replay (the first one right after capture included): learning rates a scheduler
  /// changed go to the device, baked options are checked, and the host's step counts advance.
  void before_replay() {
    for (std::size_t i = 0; i < groups_.size(); ++i) {
      auto& group = opt_->param_groups()[i];
      auto& g = groups_[i];
      if (baked_options(group) != g.baked)
        throw ConfigError("ctx.graphed_step: an option of the optimizer's group " + std::to_string(i) +
                          " other than the learning rate changed after the step was captured; a captured "
                          "step keeps the values it was captured with. Change only lr, or step with "
                          "ctx.backward and ctx.step");
      if (group.options().get_lr() != g.lr_value) g.lr.fill_(g.lr_value = group.options().get_lr());
      if (!adam_) continue;
      // A step taken outside the graph (an eager fallback) moved the host's counts: resynchronise.
      for (std::size_t k = 0; k < g.params.size(); ++k)
        if (adam_step(g.params[k]) != g.mirror[k]) {
          sync_steps(g);
          break;
        }
      for (std::size_t k = 0; k < g.params.size(); ++k)
        with_adam_state(g.params[k], [&](auto* state) { state->step(++g.mirror[k]); });  // current() checked it
    }
  }

 private:
  struct Group {
    double lr_value = 0;
    at::Tensor lr;
    std::vector<double> baked;
    std::vector<at::Tensor> params, state[3];  // SGD: momentum; Adam: exp_avg, exp_avg_sq, max_exp_avg_sq
    std::vector<std::int64_t> mirror;                 // Adam: the count each element of `steps` holds
    at::Tensor steps;
  };

  // The device's step counts from the optimizer's state (outside a capture: a copy from the host).
  void sync_steps(Group& g) const {
    if (!adam_) return;
    g.mirror.clear();
    for (const auto& p : g.params) g.mirror.push_back(adam_step(p));
    g.steps.copy_(at::tensor(std::vector<float>(g.mirror.begin(), g.mirror.end())));
  }

  std::vector<double> baked_options(const torch::optim::OptimizerParamGroup& group) const {
    if (adam_)
      return with_adam_options(group, [](const auto& o) {
        return std::vector<double>{std::get<0>(o.betas()), std::get<1>(o.betas()), o.eps(), o.weight_decay(),
                                   double(o.amsgrad())};
      });
    const auto& o = static_cast<const torch::optim::SGDOptions&>(group.options());
    return {o.momentum(), o.dampening(), o.weight_decay(), double(o.nesterov())};
  }

  // Adam's and AdamW's options and state are distinct classes with the same members.
  template <class F>
  auto with_adam_options(const torch::optim::OptimizerParamGroup& group, F f) const
      -> decltype(f(std::declval<const torch::optim::AdamOptions&>())) {
    if (decoupled_) return f(static_cast<const torch::optim::AdamWOptions&>(group.options()));
    return f(static_cast<const torch::optim::AdamOptions&>(group.options()));
  }
  template <class F>
  auto with_adam_state(const at::Tensor& p, F f) const -> decltype(f(std::declval<torch::optim::AdamParamState*>())) {
    if (decoupled_) return f(find_state<torch::optim::AdamWParamState>(*opt_, p));
    return f(find_state<torch::optim::AdamParamState>(*opt_, p));
  }
  std::int64_t adam_step(const at::Tensor& p) const {
    return with_adam_state(p, [](auto* state) { return state ? state->step() : std::int64_t{-1}; });
  }

  at::Tensor state_tensor(const at::Tensor& p, int s) const {
    if (!adam_) {
      auto* state = find_state<torch::optim::SGDParamState>(*opt_, p);
      return state ? state->momentum_buffer() : at::Tensor();
    }
    return with_adam_state(p, [s](auto* a) {
      return !a ? at::Tensor() : s == 0 ? a->exp_avg() : s == 1 ? a->exp_avg_sq() : a->max_exp_avg_sq();
    });
  }

  void add_sgd_state(Group& g, const at::Tensor& p, const torch::optim::OptimizerParamGroup& group) {
    if (static_cast<const torch::optim::SGDOptions&>(group.options()).momentum() == 0) return;
    auto* state = find_state<torch::optim::SGDParamState>(*opt_, p);
    if (state == nullptr || !state->momentum_buffer().defined() || !state->momentum_buffer().is_contiguous())
      throw ConfigError("ctx.graphed_step: a parameter has a gradient but no momentum buffer after the warm-up "
                        "steps; give GraphOptions::warmup_steps at least 1 and let every parameter that the "
                        "captured step trains have a gradient in the warm-up");
    g.state[0].push_back(state->momentum_buffer());
  }

  void add_adam_state(Group& g, const at::Tensor& p) {
    with_adam_state(p, [&](auto* state) {
      if (state == nullptr || !state->exp_avg().is_contiguous() || !state->exp_avg_sq().is_contiguous())
        throw ConfigError("ctx.graphed_step: a parameter has a gradient but no Adam state after the warm-up steps; "
                          "give GraphOptions::warmup_steps at least 1 and let every parameter that the captured "
                          "step trains have a gradient in the warm-up");
      g.state[0].push_back(state->exp_avg());
      g.state[1].push_back(state->exp_avg_sq());
      if (state->max_exp_avg_sq().defined()) g.state[2].push_back(state->max_exp_avg_sq());
    });
  }

  torch::optim::Optimizer* opt_;
  bool adam_ = false, decoupled_ = false;
  std::vector<Group> groups_;
};
#endif

}  // namespace precision::detail

DTRAIN_NAMESPACE_END
