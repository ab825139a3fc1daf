// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of progress_meter.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/tracking/progress_meter.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace tracking {

DTRAIN_INLINE void ProgressMeter::on_step(std::int64_t steps, std::int64_t epoch, std::int64_t epoch_batches) {
  history_.on_step(steps, epoch, samples_);
  if (first_step_ == clock::time_point{}) {
    first_step_ = clock::now();
    steps_at_first_ = steps - 1;
    samples_at_first_ = samples_;
  }
  if (steps - steps_at_first_ >= 2 && progress_.due()) draw(steps, epoch, epoch_batches);
}

DTRAIN_INLINE void ProgressMeter::close(std::int64_t steps, std::int64_t epoch, std::int64_t epoch_batches, bool finished) {
  if (finished) total_steps_ = steps;
  if (enabled() && first_step_ != clock::time_point{} && steps > steps_at_first_) draw(steps, epoch, epoch_batches);
  progress_.close();
}

DTRAIN_INLINE void ProgressMeter::draw(std::int64_t steps, std::int64_t epoch, std::int64_t epoch_batches) {
  ProgressSnapshot p;
  p.epoch = epoch;
  p.epochs = epochs_;
  p.step = steps;
  if (total_steps_ > 0) p.total_steps = total_steps_;
  else if (capped_epoch_steps_ > 0) p.total_steps = epoch_first_step_ + (epochs_ - epoch) * capped_epoch_steps_;
  else p.total_steps = epochs_ * epoch_batches;
  const double elapsed = std::chrono::duration<double>(clock::now() - first_step_).count();
  if (elapsed > 0) {
    p.steps_per_s = static_cast<double>(steps - steps_at_first_) / elapsed;
    p.samples_per_s = static_cast<double>(samples_ - samples_at_first_) / elapsed;
  }
  if (last_loss_.defined()) p.loss = last_loss_.item<double>();
  progress_.draw(p);
}
}  // namespace tracking
DTRAIN_NAMESPACE_END
