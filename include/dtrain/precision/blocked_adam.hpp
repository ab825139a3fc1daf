// SPDX-License-Identifier: Apache-2.0
#pragma once
// torch::optim::Adam and AdamW on the CPU, stepped block by block. opt.step() runs each of its
// element-wise ops over a whole parameter before the next one: on a 20,002 x 128 embedding (10 MB
// a tensor) each op streams the parameter, a moment or a temporary through memory again. The same
// ops over blocks of 64Ki elements (256 KiB of float, in the L2 cache) read each tensor from
// memory about once per step. They are the same ops, in the same order, on every element, so the
// result is opt.step()'s, bit for bit (tests/unit/policy_test.cpp compares them).

#include <cstdint>
#include <memory>

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/types.h>

#include <dtrain/detail/torch_compat.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace precision::detail {

/// Elements per block: 256 KiB of float, so a block of each tensor and the temporaries fit in a
/// 1 MiB L2 cache together.
inline constexpr std::int64_t adam_block = std::int64_t{1} << 16;

template <class State>
State* find_state(torch::optim::Optimizer& opt, const at::Tensor& p) {
  auto it = opt.state().find(compat::optimizer_state_key(p));
  return it == opt.state().end() ? nullptr : static_cast<State*>(it->second.get());
}

/// Parameter p's Adam or AdamW state, made as their step() makes it where there is none yet (step
/// 0, zero moments), with amsgrad's maximum where it is asked for and missing.
template <class State>
State& adam_state(torch::optim::Optimizer& opt, const at::Tensor& p, bool amsgrad) {
  auto* state = find_state<State>(opt, p);
  if (state == nullptr) {
    auto fresh = std::make_unique<State>();
    fresh->step(0);
    fresh->exp_avg(torch::zeros_like(p, at::MemoryFormat::Preserve));
    fresh->exp_avg_sq(torch::zeros_like(p, at::MemoryFormat::Preserve));
    state = fresh.get();
    opt.state()[compat::optimizer_state_key(p)] = std::move(fresh);
  }
  if (amsgrad && !state->max_exp_avg_sq().defined())
    state->max_exp_avg_sq(torch::zeros_like(p, at::MemoryFormat::Preserve));
  return *state;
}

/// Whether every parameter with a gradient, its gradient and its state (where there is one yet)
/// are dense contiguous float or double CPU tensors, which blocks can be cut from as flat views.
template <class State>
bool blockable(torch::optim::Optimizer& opt) {
  auto flat = [](const at::Tensor& t, const at::Tensor& p) {
    return !t.defined() || (t.layout() == at::kStrided && t.device().is_cpu() && t.is_contiguous() &&
                            t.scalar_type() == p.scalar_type() && t.sizes() == p.sizes());
  };
  bool any = false;
  for (auto& group : opt.param_groups())
    for (const auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      if (!(p.scalar_type() == at::kFloat || p.scalar_type() == at::kDouble) || !flat(p, p) || !flat(p.grad(), p))
        return false;
      if (const auto* s = find_state<State>(opt, p))
        if (!flat(s->exp_avg(), p) || !flat(s->exp_avg_sq(), p) || !flat(s->max_exp_avg_sq(), p)) return false;
      any = true;
    }
  return any;
}

/// Adam's (AdamW's) step() block by block where `opt` is blockable; false, having done
/// nothing, where it is not (the caller steps as usual).
bool step_in_blocks(torch::optim::Adam& opt);
bool step_in_blocks(torch::optim::AdamW& opt);

}  // namespace precision::detail

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/precision/impl/blocked_adam.ipp>
#endif
