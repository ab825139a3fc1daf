// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of gradient_hooks.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/strategy/detail/gradient_hooks.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace strategy {
namespace detail {

DTRAIN_INLINE void write_grad(torch::Tensor slot, const torch::Tensor& g, at::IntArrayRef sizes) {
  if (!g.defined()) {
    slot.zero_();
  } else if (g.is_sparse()) {
    slot.zero_();
    slot.view(sizes).add_(g);
  } else {
    slot.copy_(g.reshape({-1}));
  }
}
}  // namespace detail
}  // namespace strategy
DTRAIN_NAMESPACE_END
