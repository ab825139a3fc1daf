// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of warmup_cosine.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/schedule/warmup_cosine.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace schedule {

DTRAIN_INLINE WarmupCosine::WarmupCosine(torch::optim::Optimizer& optimizer, WarmupCosineOptions options)
    : optimizer_(&optimizer), o_(options), base_(detail::group_lrs(optimizer)), lrs_(base_) {
  detail::require(o_.warmup_steps >= 0 && o_.total_steps > o_.warmup_steps,
                  "WarmupCosine: warmup_steps " + std::to_string(o_.warmup_steps) + " and total_steps " +
                      std::to_string(o_.total_steps) + " need 0 <= warmup_steps < total_steps");
  detail::require(o_.start_factor > 0 && o_.start_factor <= 1,
                  "WarmupCosine: start_factor " + std::to_string(o_.start_factor) + " must be in (0, 1]");
  detail::require(o_.min_lr >= 0, "WarmupCosine: min_lr " + std::to_string(o_.min_lr) + " must not be negative");
  apply();
}

DTRAIN_INLINE double WarmupCosine::lr_at(double base, std::int64_t t) const {
  if (t < o_.warmup_steps)
    return base * (o_.start_factor + (1 - o_.start_factor) * static_cast<double>(t) / o_.warmup_steps);
  if (t >= o_.total_steps) return o_.min_lr;
  const double pi = std::acos(-1.0);
  const double progress = static_cast<double>(t - o_.warmup_steps) / static_cast<double>(o_.total_steps - o_.warmup_steps);
  return o_.min_lr + (base - o_.min_lr) * (1 + std::cos(pi * progress)) / 2;
}

DTRAIN_INLINE void WarmupCosine::apply() {
  for (std::size_t i = 0; i < base_.size(); ++i) lrs_[i] = lr_at(base_[i], steps_);
  detail::set_group_lrs(*optimizer_, lrs_);
}
}  // namespace schedule
DTRAIN_NAMESPACE_END
