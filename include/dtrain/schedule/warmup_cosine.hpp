// SPDX-License-Identifier: Apache-2.0
#pragma once
// schedule::WarmupCosine: a linear warm-up, then cosine annealing to min_lr. PyTorch's
// SequentialLR([LinearLR(start_factor, total_iters=warmup_steps),
//               CosineAnnealingLR(T_max=total_steps - warmup_steps, eta_min=min_lr)],
//              milestones=[warmup_steps])
// sets the same learning rates (within rounding) up to total_steps.

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <dtrain/schedule/schedule.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace schedule {

struct WarmupCosineOptions {
  /// Steps of the linear warm-up, from base * start_factor up to base.
  std::int64_t warmup_steps = 0;
  /// The step at which the cosine reaches min_lr; the rate stays there after it (where PyTorch's
  /// CosineAnnealingLR would rise again).
  std::int64_t total_steps = 0;
  double start_factor = 1.0 / 3;  // LinearLR's default
  double min_lr = 0;              // CosineAnnealingLR's eta_min
};

/// After t calls of step(), each group's learning rate is
///   base * (start_factor + (1 - start_factor) * t / warmup_steps)           t < warmup_steps
///   min_lr + (base - min_lr) * (1 + cos(pi * (t - warmup) / (total - warmup))) / 2   up to total_steps
/// computed from t, so a resumed schedule sets bitwise the rates of one never stopped. The first
/// rate (t = 0) is set when the schedule is built, as PyTorch's schedulers do.
class WarmupCosine {
 public:
  static constexpr const char* kind = "WarmupCosine";

  WarmupCosine(torch::optim::Optimizer& optimizer, WarmupCosineOptions options);

  /// One optimizer step taken: sets the learning rates of step steps()+1.
  void step() {
    ++steps_;
    apply();
  }

  /// The learning rate of a group whose base rate is `base`, after `t` steps.
  double lr_at(double base, std::int64_t t) const;

  std::vector<double> lrs() const { return lrs_; }
  std::int64_t steps() const { return steps_; }

  void save(torch::serialize::OutputArchive& a) const { detail::save_common(a, kind, steps_, base_, lrs_); }
  /// The steps taken, the base and current learning rates (set in the optimizer); the options stay
  /// the constructor's, so a resumed run may lengthen total_steps.
  void load(torch::serialize::InputArchive& a) { detail::load_common(a, kind, *optimizer_, steps_, base_, lrs_); }

 private:
  void apply();

  torch::optim::Optimizer* optimizer_;
  WarmupCosineOptions o_;
  std::vector<double> base_, lrs_;
  std::int64_t steps_ = 0;
};

}  // namespace schedule

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/schedule/impl/warmup_cosine.ipp>
#endif
