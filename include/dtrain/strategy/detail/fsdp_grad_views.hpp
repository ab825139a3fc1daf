// SPDX-License-Identifier: Apache-2.0
#pragma once
// strategy::fsdp<>'s gradients as views of each unit's flat (padded) gradient, so that autograd
// accumulates straight into the buffer the reduce-scatter reads. Free functions over fsdp<>'s
// per-model state (`Sharded`: its units, parameters and shapes; strategy/fsdp.hpp).

#include <cstddef>

#include <torch/types.h>

#include <dtrain/strategy/detail/flat_storage.hpp>
#include <dtrain/strategy/detail/gradient_hooks.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace strategy::detail {

/// Gives unit `u` its flat gradient (zeros) unless it has one.
template <class Unit>
void ensure_grad_full(Unit& u) {
  if (!u.grad_full.defined()) u.grad_full = flat_zeros(u.padded(), u.shard.options().requires_grad(false), u.spare_grad);
}

/// Parameter `k`'s place in unit `u`'s flat gradient.
template <class Sharded, class Unit>
torch::Tensor grad_slot(const Sharded& s, Unit& u, std::size_t k) {
  std::size_t i = 0;
  while (u.params[i] != k) ++i;
  return u.grad_full.narrow(0, u.offsets[i], s.numel_of(k));
}

/// Whether parameter `k`'s .grad is (still) the view of its slot.
template <class Sharded>
bool grad_aliased(Sharded& s, std::size_t k) {
  auto& u = s.units[s.unit_of[k]];
  const auto& g = s.params[k].grad();
  return u.grad_full.defined() && g.defined() && g.data_ptr() == grad_slot(s, u, k).data_ptr();
}

/// Before backward: each parameter's .grad becomes a view of its unit's flat gradient, so
/// autograd accumulates straight into it (no second full-size copy). A .grad that was replaced
/// (module zero_grad, or assigned) is copied in and pointed back.
template <class Sharded>
void prepare_grads(Sharded& s) {
  torch::NoGradGuard no_grad;
  for (auto& u : s.units) {
    ensure_grad_full(u);
    for (std::size_t k : u.params) {
      if (grad_aliased(s, k)) continue;
      auto& g = s.params[k].mutable_grad();
      auto slot = grad_slot(s, u, k);
      if (g.defined()) write_grad(slot, g, s.shapes[k]);
      g = slot.view(s.shapes[k]);
    }
  }
}

/// Parameter `k`'s gradient is complete: into its slot (zeros when it has none), and one fewer
/// pending in its unit.
template <class Sharded>
void take_grad(Sharded& s, std::size_t k) {
  auto& u = s.units[s.unit_of[k]];
  ensure_grad_full(u);
  if (!grad_aliased(s, k)) {
    auto& g = s.params[k].mutable_grad();
    auto slot = grad_slot(s, u, k);
    write_grad(slot, g, s.shapes[k]);
    g = slot.view(s.shapes[k]);
  }
  --u.pending;
}

}  // namespace strategy::detail

DTRAIN_NAMESPACE_END
