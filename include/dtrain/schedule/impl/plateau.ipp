// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of plateau.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/schedule/plateau.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace schedule {

DTRAIN_INLINE ReduceLROnPlateau::ReduceLROnPlateau(torch::optim::Optimizer& optimizer, PlateauOptions options)
    : optimizer_(&optimizer), o_(options), base_(detail::group_lrs(optimizer)), lrs_(base_), best_(worst()) {
  detail::require(o_.factor > 0 && o_.factor < 1,
                  "ReduceLROnPlateau: factor " + std::to_string(o_.factor) + " must be in (0, 1), e.g. 0.1");
  detail::require(o_.patience >= 0 && o_.cooldown >= 0 && o_.threshold >= 0 && o_.min_lr >= 0 && o_.eps >= 0,
                  "ReduceLROnPlateau: patience, cooldown, threshold, min_lr and eps must not be negative");
}

DTRAIN_INLINE void ReduceLROnPlateau::step(double metric) {
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

DTRAIN_INLINE void ReduceLROnPlateau::save(torch::serialize::OutputArchive& a) const {
  detail::save_common(a, kind, steps_, base_, lrs_);
  a.write("best", torch::tensor(best_, torch::dtype(torch::kFloat64)));
  a.write("bad_steps", torch::tensor(bad_steps_));
  a.write("cooldown_counter", torch::tensor(cooldown_counter_));
}

DTRAIN_INLINE void ReduceLROnPlateau::load(torch::serialize::InputArchive& a) {
  detail::load_common(a, kind, *optimizer_, steps_, base_, lrs_);
  torch::Tensor best, bad, cool;
  a.read("best", best);
  a.read("bad_steps", bad);
  a.read("cooldown_counter", cool);
  best_ = best.item<double>();
  bad_steps_ = bad.item<std::int64_t>();
  cooldown_counter_ = cool.item<std::int64_t>();
}

DTRAIN_INLINE double ReduceLROnPlateau::worst() const {
  const double inf = std::numeric_limits<double>::infinity();
  return o_.mode == Mode::min ? inf : -inf;
}

DTRAIN_INLINE bool ReduceLROnPlateau::better(double a, double best) const {
  if (o_.mode == Mode::min)
    return o_.threshold_mode == Threshold::rel ? a < best * (1. - o_.threshold) : a < best - o_.threshold;
  return o_.threshold_mode == Threshold::rel ? a > best * (o_.threshold + 1.) : a > best + o_.threshold;
}
}  // namespace schedule
DTRAIN_NAMESPACE_END
