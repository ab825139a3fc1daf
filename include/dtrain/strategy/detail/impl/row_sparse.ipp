// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of row_sparse.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/strategy/detail/row_sparse.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace strategy {
namespace detail {

DTRAIN_INLINE std::vector<torch::Tensor> row_sparse_parameters(torch::nn::Module& module) {
  std::vector<torch::Tensor> out;
  auto add = [&](const torch::Tensor& w) {
    if (!w.requires_grad() || w.dim() < 1) return;
    for (const auto& seen : out)
      if (seen.is_same(w)) return;
    out.push_back(w);
  };
  for (const auto& m : module.modules()) {
    if (auto* e = dynamic_cast<torch::nn::EmbeddingImpl*>(m.get()); e != nullptr && e->options.sparse()) add(e->weight);
    if (auto* e = dynamic_cast<torch::nn::EmbeddingBagImpl*>(m.get()); e != nullptr && e->options.sparse())
      add(e->weight);
  }
  return out;
}
}  // namespace detail
}  // namespace strategy
DTRAIN_NAMESPACE_END
