// SPDX-License-Identifier: Apache-2.0
#pragma once
// Sparse gradients stepped as the dense gradients they equal. An Embedding made with
// `.sparse(true)` gets a sparse gradient (cheap backward; under ddp<> a reduction of the rows
// looked up only), but torch::optim's Adam, AdamW and RMSprop refuse sparse gradients. ctx.step
// lends every optimizer the dense equal for the step, so a sparse layer trains as the dense one
// does, with any optimizer.

#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <dtrain/version.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace precision {

/// One dense buffer per parameter with a sparse gradient, reused step after step: before each
/// step only the rows the previous step wrote are cleared, so a step costs the rows looked up,
/// not the table.
class dense_gradients {
 public:
  /// While alive, every parameter of the optimizer whose gradient is sparse has the dense equal
  /// as its .grad; the sparse gradients come back when it ends.
  class lent {
   public:
    lent() = default;
    lent(lent&& o) noexcept : swapped_(std::exchange(o.swapped_, {})) {}
    lent& operator=(lent&&) = delete;
    ~lent() {
      for (auto& [p, sparse] : swapped_) p.mutable_grad() = std::move(sparse);
    }

   private:
    friend class dense_gradients;
    std::vector<std::pair<torch::Tensor, torch::Tensor>> swapped_;  // parameter, its sparse gradient
  };

  template <class Optimizer>
  lent lend(Optimizer& opt) {
    lent out;
    if constexpr (std::is_base_of_v<torch::optim::Optimizer, Optimizer>) {
      for (auto& group : opt.param_groups())
        for (auto& p : group.params())
          if (p.grad().defined() && p.grad().is_sparse()) {
            out.swapped_.emplace_back(p, p.grad());
            p.mutable_grad() = densify(p);
          }
    }
    return out;
  }

 private:
  struct buffer {
    torch::Tensor dense;
    torch::Tensor rows;  // rows written last time; undefined: the whole table
  };

  torch::Tensor densify(const torch::Tensor& p);

  std::unordered_map<const c10::TensorImpl*, buffer> buffers_;
};

}  // namespace precision

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/precision/impl/dense_gradients.ipp>
#endif
