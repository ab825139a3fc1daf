// SPDX-License-Identifier: Apache-2.0
#pragma once
// precision::fp32: forward and backward in the parameters' own precision.

#include <torch/types.h>

#include <dtrain/policy/category.hpp>
#include <dtrain/precision/optimizer_step.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace precision {

/// Full precision: no autocast, no loss scaling. ctx.backward(loss) is loss.backward().
struct fp32 {
  using category = dtrain::category::precision;
  static constexpr const char* name = "fp32";
  static constexpr bool requires_cuda = false;

  /// Per-worker state: nothing to keep.
  struct state {
    explicit state(torch::Device) {}
    struct scope {};
    scope autocast() const { return {}; }
    void backward(const torch::Tensor& loss) { loss.backward(); }
    template <class Optimizer>
    bool step(Optimizer& opt) {
      optimizer_step(opt);
      return true;
    }
  };
};

}  // namespace precision

DTRAIN_NAMESPACE_END
