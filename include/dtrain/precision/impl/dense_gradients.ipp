// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of dense_gradients.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/precision/dense_gradients.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace precision {

DTRAIN_INLINE torch::Tensor dense_gradients::densify(const torch::Tensor& p) {
  torch::NoGradGuard no_grad;
  const auto& g = p.grad();
  auto& b = buffers_[p.unsafeGetTensorImpl()];
  if (!b.dense.defined() || b.dense.sizes() != g.sizes() || b.dense.scalar_type() != g.scalar_type() ||
      b.dense.device() != g.device()) {
    b.dense = torch::zeros(g.sizes(), g.options().layout(torch::kStrided));
  } else if (b.rows.defined()) {
    b.dense.index_fill_(0, b.rows, 0);
  } else {
    b.dense.zero_();
  }
  if (g.sparse_dim() == 1) {
    b.rows = g._indices()[0].clone();  // zero_grad may clear the gradient's own in place
    b.dense.index_add_(0, b.rows, g._values());  // sums an uncoalesced gradient's repeats
  } else {
    b.rows = torch::Tensor();
    b.dense.add_(g);
  }
  return b.dense;
}
}  // namespace precision
DTRAIN_NAMESPACE_END
