// SPDX-License-Identifier: Apache-2.0
#pragma once
// StepHistory: rank 0's record of training between reports, the run directory's steps.jsonl. A
// run that reports once per epoch still gets a loss and a throughput curve from it, without a
// synchronised report per point: rank 0 writes what it saw, and the other ranks do nothing.
//
// One JSON object per line:
//   {"step": 120, "epoch": 0, "timestamp": 1795720001.5, "loss": 0.41, "samples_per_s": 2451.3, ...}
// every ProgressConfig::record_every optimizer steps (`loss`: the mean of the losses given to
// ctx.backward since the previous row; `samples_per_s`: the whole group's, over those steps; then
// the last value of each name given to ctx.log_step since), and one row when a worker group starts:
//   {"step": 118, "epoch": 0, "timestamp": ..., "event": "restart", "world_size": 2}
// (`event`: "start", "resume" (a new fit() continuing the run) or "restart"). A resumed group
// first cuts the file back to the step of its checkpoint, as metrics.jsonl is cut to its iteration.

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <torch/types.h>

#include <dtrain/metrics.hpp>
#include <dtrain/result.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace tracking {

class StepHistory {
  using clock = std::chrono::steady_clock;

 public:
  /// Records nothing (every rank but 0, or record_every = 0).
  StepHistory() = default;
  /// Rows into `file` every `every` optimizer steps (0: none).
  StepHistory(std::filesystem::path file, std::int64_t every) : file_(std::move(file)), every_(every) {}

  bool enabled() const { return every_ > 0; }

  /// A worker group starts at optimizer step `step` (its checkpoint's, 0 when fresh): rows after
  /// that step are cut (the group trains them again), and the start is recorded.
  void group_started(std::int64_t step, std::int64_t epoch, int attempt, int world_size);

  /// A loss given to ctx.backward: kept (detached, on its device, no synchronisation) until the
  /// next row sums them. One detach a step; the sum is one stack and one read per row.
  void on_backward(const torch::Tensor& loss);

  /// Values for the next row (ctx.log_step); a name given twice keeps its last value.
  void log(const Metrics& values);

  /// After optimizer step `step` of `epoch`, the group having trained `samples` samples in all: a
  /// row when `step` is a multiple of record_every. The first step of a group only starts the
  /// clock (it carries the group's warm-up).
  void on_step(std::int64_t step, std::int64_t epoch, std::int64_t samples);

 private:
  // Best effort, like the progress line: a step history that cannot be written (a full disk) is
  // given up with one warning, and training goes on.
  void append(const Metrics& row);
  // The losses since the last row, summed in double precision on their device.
  torch::Tensor loss_sum() const;
  void give_up(const std::exception& e) {
    std::fprintf(stderr, "dtrain: warning: %s; no step history is recorded from here on (training goes on)\n",
                 e.what());
    every_ = 0;
  }

  std::filesystem::path file_;
  std::int64_t every_ = 0;
  std::vector<torch::Tensor> losses_;  // since the last row, or since partial_sum_ was taken
  torch::Tensor partial_sum_;
  std::int64_t loss_count_ = 0, samples_since_ = 0;
  clock::time_point since_{};
  Metrics logged_;
};

}  // namespace tracking

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/tracking/impl/step_history.ipp>
#endif
