// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of step_lr.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/schedule/step_lr.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace schedule {

DTRAIN_INLINE StepLR::StepLR(torch::optim::Optimizer& optimizer, std::int64_t step_size, double gamma)
    : optimizer_(&optimizer), step_size_(step_size), gamma_(gamma), base_(detail::group_lrs(optimizer)),
      lrs_(base_) {
  detail::require(step_size >= 1, "StepLR: step_size " + std::to_string(step_size) + " must be at least 1");
  detail::require(gamma > 0 && std::isfinite(gamma),
                  "StepLR: gamma " + std::to_string(gamma) + " must be a positive finite factor (e.g. 0.1)");
}

DTRAIN_INLINE void StepLR::step() {
  ++steps_;
  const double factor = std::pow(gamma_, static_cast<double>(steps_ / step_size_));
  for (std::size_t i = 0; i < base_.size(); ++i) lrs_[i] = base_[i] * factor;
  detail::set_group_lrs(*optimizer_, lrs_);
}
}  // namespace schedule
DTRAIN_NAMESPACE_END
