// SPDX-License-Identifier: Apache-2.0
#pragma once
// ProgressMeter: the counts rank 0's progress line shows (steps, samples, rates since the group's
// first step, the last loss), and when to draw it; the same counts go into the step history.

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include <torch/types.h>

#include <dtrain/config.hpp>
#include <dtrain/tracking/progress.hpp>
#include <dtrain/tracking/step_history.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace tracking {

class ProgressMeter {
  using clock = std::chrono::steady_clock;

 public:
  /// Draws only on rank 0 (`enabled`), and only when the configured verbosity asks for it, on
  /// `fd` (stderr; `terminal` as Progress takes it).
  /// `history`: rank 0's steps.jsonl (records nothing by default).
  ProgressMeter(const ProgressConfig& config, bool enabled, int fd = 2, std::optional<bool> terminal = std::nullopt,
                StepHistory history = {})
      : progress_(config, enabled, fd, terminal), history_(std::move(history)) {}

  bool enabled() const { return progress_.enabled(); }
  bool verbose() const { return progress_.verbose(); }

  /// The loss of this step; read only when a line is drawn.
  void on_backward(const torch::Tensor& loss) {
    if (enabled()) last_loss_ = loss.detach();
    history_.on_backward(loss);
  }
  /// Values for the step history's next row (ctx.log_step).
  void log(const Metrics& values) { history_.log(values); }
  StepHistory& history() { return history_; }
  /// Samples the whole group trained (the Trainer's Sampler's batches times the world size).
  void add_samples(std::int64_t n) { samples_ += n; }
  void set_epochs(std::int64_t n) { epochs_ = n; }
  /// The optimizer steps the line counts towards, when the loop stops before its epochs end.
  void set_total_steps(std::int64_t n) { total_steps_ = n; }
  /// An epoch begins, `steps` optimizer steps having been taken before it (a resumed epoch's
  /// trained batches not included).
  void begin_epoch(std::int64_t steps) { epoch_first_step_ = steps; }
  /// The loop ended the current epoch early (ctx.end_epoch()) at optimizer step `steps`: a
  /// per-epoch step cap. The total counts every epoch left as long as this one.
  void end_epoch_early(std::int64_t steps) {
    if (steps > epoch_first_step_) capped_epoch_steps_ = steps - epoch_first_step_;
  }

  /// After optimizer step number `steps` (counting a resumed run's) in `epoch` of `epoch_batches`
  /// batches: draws the line when one is due. Rates need two steps of this group.
  void on_step(std::int64_t steps, std::int64_t epoch, std::int64_t epoch_batches);

  /// A line of its own (a report, an evaluation) under Verbosity::verbose.
  void note(const std::string& line) {
    if (verbose()) progress_.note(line);
  }

  /// The loop ended: the final count, then the line is closed. A loop that `finished` (not cut
  /// short by a stop) did all its work: its last line reads 100%, whatever the total was.
  void close(std::int64_t steps, std::int64_t epoch, std::int64_t epoch_batches, bool finished);

 private:
  void draw(std::int64_t steps, std::int64_t epoch, std::int64_t epoch_batches);

  Progress progress_;
  StepHistory history_;
  torch::Tensor last_loss_;
  std::int64_t epochs_ = 0, total_steps_ = 0, samples_ = 0, steps_at_first_ = 0, samples_at_first_ = 0;
  std::int64_t epoch_first_step_ = 0, capped_epoch_steps_ = 0;  // a per-epoch step cap (end_epoch_early)
  clock::time_point first_step_{};
};

}  // namespace tracking

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/tracking/impl/progress_meter.ipp>
#endif
