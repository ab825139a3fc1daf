// SPDX-License-Identifier: Apache-2.0
#pragma once
// schedule::ReduceLROnPlateau: the learning rate multiplied by factor when a metric stopped
// improving for patience steps, as PyTorch's torch.optim.lr_scheduler.ReduceLROnPlateau (the same
// modes, thresholds, cooldown, min_lr and eps; the same rates on the same metric sequence).

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <dtrain/schedule/schedule.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace schedule {

struct PlateauOptions {
  enum class Mode { min, max };
  enum class Threshold { rel, abs };
  /// min: the metric improves by falling (a loss); max: by rising (an accuracy).
  Mode mode = Mode::min;
  double factor = 0.1;
  /// Steps without improvement that are tolerated; the next one reduces the rate.
  std::int64_t patience = 10;
  /// An improvement must beat the best by this much: relatively (best * (1 -/+ threshold)) or
  /// absolutely (best -/+ threshold).
  double threshold = 1e-4;
  Threshold threshold_mode = Threshold::rel;
  /// Steps after a reduction during which bad steps are not counted.
  std::int64_t cooldown = 0;
  double min_lr = 0;
  /// A reduction smaller than eps is not made.
  double eps = 1e-8;
};

/// Call step(metric) once per evaluation, with the same metric on every rank (a reported,
/// all-reduced value): each rank then sets the same learning rate.
class ReduceLROnPlateau {
 public:
  static constexpr const char* kind = "ReduceLROnPlateau";
  using Mode = PlateauOptions::Mode;
  using Threshold = PlateauOptions::Threshold;

  explicit ReduceLROnPlateau(torch::optim::Optimizer& optimizer, PlateauOptions options = {});

  /// One evaluation's metric: counts it as an improvement or a bad step, and reduces every
  /// group's rate (to no less than min_lr) after more than `patience` bad steps. A NaN counts as
  /// a bad step, as in PyTorch.
  void step(double metric);

  std::vector<double> lrs() const { return lrs_; }
  std::int64_t steps() const { return steps_; }
  /// The best metric so far (+inf in mode min, -inf in mode max before the first step).
  double best() const { return best_; }
  std::int64_t bad_steps() const { return bad_steps_; }

  void save(torch::serialize::OutputArchive& a) const;
  /// The counters, the best metric and the learning rates (set in the optimizer); the options
  /// stay the constructor's.
  void load(torch::serialize::InputArchive& a);

 private:
  double worst() const;
  bool better(double a, double best) const;

  torch::optim::Optimizer* optimizer_;
  PlateauOptions o_;
  std::vector<double> base_, lrs_;
  double best_;
  std::int64_t steps_ = 0, bad_steps_ = 0, cooldown_counter_ = 0;
};

}  // namespace schedule

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/schedule/impl/plateau.ipp>
#endif
