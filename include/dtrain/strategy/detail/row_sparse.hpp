// SPDX-License-Identifier: Apache-2.0
#pragma once
// Row-sparse gradients under ddp<>: an Embedding or EmbeddingBag made with `.sparse(true)` has a
// gradient that touches only the rows its batch looked up. Its allreduce covers the union of the
// rows some rank touched, not the whole table: a vocabulary of 20,000 x 128 whose batch looks up
// 1,500 distinct words sends 0.8 MB, not 10 MB, and backward never writes a dense table.
//
// Which parameters take this path is a property of the model (module type and option), the same
// on every rank, so every rank issues the same collectives whatever its batch touched.

#include <cstdint>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>
#include <torch/types.h>

#include <dtrain/collective.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace strategy::detail {

/// The weights of `module`'s Embedding and EmbeddingBag layers made with `.sparse(true)` that
/// train, each once (a weight shared by two layers included).
std::vector<torch::Tensor> row_sparse_parameters(torch::nn::Module& module);

/// Averages `p`'s gradient over the ranks, row by row, sending only the rows some rank's gradient
/// holds. Two collectives, the same on every rank: a float mask over the rows (summed), then the
/// union's rows (mean). The result keeps this rank's layout: a sparse gradient becomes the
/// coalesced sparse mean over the union; a dense one (the weight is also used densely, as a tied
/// output layer) the dense mean. A rank without a gradient receives the others' mean; when no rank
/// has one the gradient stays as it is.
template <class Communicator>
void allreduce_rows(Communicator& comm, torch::Tensor& p) {
  torch::NoGradGuard no_grad;
  const std::int64_t table_rows = p.size(0);
  auto row_shape = p.sizes().vec();  // [rows, the rest of p's shape]
  const auto index_options = p.options().dtype(torch::kLong);
  auto g = p.grad();
  const bool sparse = !g.defined() || g.is_sparse();
  torch::Tensor rows, values;  // this rank's rows (sorted, distinct) and their values
  if (!g.defined()) {
    rows = torch::empty({0}, index_options);
    row_shape[0] = 0;
    values = torch::empty(row_shape, p.options());
  } else if (sparse) {
    const auto c = g.coalesce();
    if (c.sparse_dim() == 1) {
      rows = c._indices()[0];
      values = c._values();
    } else {  // sparse in more dimensions (LibTorch 1.13's zero_grad leaves such an empty one)
      rows = std::get<0>(torch::unique_consecutive(c._indices()[0]));
      values = c.to_dense().index_select(0, rows);
    }
  } else {
    rows = torch::arange(table_rows, index_options);
    values = g;
  }
  auto mask = torch::zeros({table_rows}, p.options().dtype(torch::kFloat));
  mask.index_fill_(0, rows, 1);
  dtrain::detail::allreduce(comm, mask, reduce::sum, runs::by_waiter).wait();
  const auto all = mask.nonzero().reshape({-1});
  if (all.numel() == 0) return;
  row_shape[0] = all.numel();
  auto reduced = torch::zeros(row_shape, values.options());
  reduced.index_copy_(0, torch::searchsorted(all, rows), values);
  dtrain::detail::allreduce(comm, reduced, reduce::mean, runs::by_waiter).wait();
  // A rank that held a dense gradient marked every row: `reduced` is the whole table.
  p.mutable_grad() =
      sparse ? at::_sparse_coo_tensor_unsafe(all.unsqueeze(0).clone(), reduced, p.sizes())._coalesced_(true) : reduced;
}

}  // namespace strategy::detail

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/strategy/detail/impl/row_sparse.ipp>
#endif
