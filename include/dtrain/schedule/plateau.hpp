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

  explicit ReduceLROnPlateau(torch::optim::Optimizer& optimizer, PlateauOptions options = {})
      : optimizer_(&optimizer), o_(options), base_(detail::group_lrs(optimizer)), lrs_(base_), best_(worst()) {
    detail::require(o_.factor > 0 && o_.factor < 1,
                    "ReduceLROnPlateau: factor " + std::to_string(o_.factor) + " must be in (0, 1), e.g. 0.1");
    detail::require(o_.patience >= 0 && o_.cooldown >= 0 && o_.threshold >= 0 && o_.min_lr >= 0 && o_.eps >= 0,
                    "ReduceLROnPlateau: patience, cooldown, threshold, min_lr and eps must not be negative");
  }

  /// One evaluation's metric: counts it as an improvement or a bad step, and reduces every
  /// group's rate (to no less than min_lr) after more than `patience` bad steps. A NaN counts as
  /// a bad step, as in PyTorch.
  void step(double metric) {
    ++steps_;
    if (better(metric, best_)) {
      best_ = metric;
      bad_steps_ = 0;
    } else {
      ++bad_steps_;
    }
    if (cooldown_counter_ > 0) {
      --cooldown_counter_;
      bad_steps_ = 0;  // bad steps in the cooldown are not counted
    }
    if (bad_steps_ > o_.patience) {
      lrs_ = detail::group_lrs(*optimizer_);
      for (auto& lr : lrs_) {
        const double reduced = std::max(lr * o_.factor, o_.min_lr);
        if (lr - reduced > o_.eps) lr = reduced;
      }
      detail::set_group_lrs(*optimizer_, lrs_);
      cooldown_counter_ = o_.cooldown;
      bad_steps_ = 0;
    }
    lrs_ = detail::group_lrs(*optimizer_);
  }

  std::vector<double> lrs() const { return lrs_; }
  std::int64_t steps() const { return steps_; }
  /// The best metric so far (+inf in mode min, -inf in mode max before the first step).
  double best() const { return best_; }
  std::int64_t bad_steps() const { return bad_steps_; }

  void save(torch::serialize::OutputArchive& a) const {
    detail::save_common(a, kind, steps_, base_, lrs_);
    a.write("best", torch::tensor(best_, torch::dtype(torch::kFloat64)));
    a.write("bad_steps", torch::tensor(bad_steps_));
    a.write("cooldown_counter", torch::tensor(cooldown_counter_));
  }
  /// The counters, the best metric and the learning rates (set in the optimizer); the options
  /// stay the constructor's.
  void load(torch::serialize::InputArchive& a) {
    detail::load_common(a, kind, *optimizer_, steps_, base_, lrs_);
    torch::Tensor best, bad, cool;
    a.read("best", best);
    a.read("bad_steps", bad);
    a.read("cooldown_counter", cool);
    best_ = best.item<double>();
    bad_steps_ = bad.item<std::int64_t>();
    cooldown_counter_ = cool.item<std::int64_t>();
  }

 private:
  double worst() const {
    const double inf = std::numeric_limits<double>::infinity();
    return o_.mode == Mode::min ? inf : -inf;
  }
  bool better(double a, double best) const {
    if (o_.mode == Mode::min)
      return o_.threshold_mode == Threshold::rel ? a < best * (1. - o_.threshold) : a < best - o_.threshold;
    return o_.threshold_mode == Threshold::rel ? a > best * (o_.threshold + 1.) : a > best + o_.threshold;
  }

  torch::optim::Optimizer* optimizer_;
  PlateauOptions o_;
  std::vector<double> base_, lrs_;
  double best_;
  std::int64_t steps_ = 0, bad_steps_ = 0, cooldown_counter_ = 0;
};

}  // namespace schedule

DTRAIN_NAMESPACE_END
