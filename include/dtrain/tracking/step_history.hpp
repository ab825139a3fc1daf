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
  void group_started(std::int64_t step, std::int64_t epoch, int attempt, int world_size) {
    if (!enabled()) return;
    try {
      MetricsHistory::truncate_jsonl(file_, "step", step);
    } catch (const std::exception& e) {  // a damaged file: left as it is, for a person to read
      give_up(e);
      return;
    }
    const char* event = attempt > 0 ? "restart" : step > 0 ? "resume" : "start";
    append({{"step", step}, {"epoch", epoch}, {"timestamp", unix_now()}, {"event", event}, {"world_size", world_size}});
  }

  /// A loss given to ctx.backward: kept (detached, on its device, no synchronisation) until the
  /// next row sums them. One detach a step; the sum is one stack and one read per row.
  void on_backward(const torch::Tensor& loss) {
    if (!enabled() || loss.numel() != 1) return;
    losses_.push_back(loss.dim() == 0 ? loss.detach() : loss.detach().reshape({}));
    ++loss_count_;
    if (losses_.size() >= 256) {  // a long interval keeps a partial sum, not every loss
      partial_sum_ = loss_sum();
      losses_.clear();
    }
  }

  /// Values for the next row (ctx.log_step); a name given twice keeps its last value.
  void log(const Metrics& values) {
    if (!enabled()) return;
    for (const auto& [k, v] : values) logged_.insert_or_assign(k, v);
  }

  /// After optimizer step `step` of `epoch`, the group having trained `samples` samples in all: a
  /// row when `step` is a multiple of record_every. The first step of a group only starts the
  /// clock (it carries the group's warm-up).
  void on_step(std::int64_t step, std::int64_t epoch, std::int64_t samples) {
    if (!enabled()) return;
    const bool first = since_ == clock::time_point{};
    if (!first && step % every_ != 0) return;  // most steps: no clock read, nothing else
    const auto now = clock::now();
    if (first) {
      since_ = now;
      samples_since_ = samples;
      return;
    }
    Metrics row = {{"step", step}, {"epoch", epoch}, {"timestamp", unix_now()}};
    const double seconds = std::chrono::duration<double>(now - since_).count();
    if (seconds > 0) row.emplace("samples_per_s", static_cast<double>(samples - samples_since_) / seconds);
    if (loss_count_ > 0) {
      row.emplace("loss", loss_sum().item<double>() / static_cast<double>(loss_count_));
      losses_.clear();
      partial_sum_.reset();
      loss_count_ = 0;
    }
    for (auto& [k, v] : logged_) row.insert_or_assign(k, std::move(v));
    logged_.clear();
    since_ = now;
    samples_since_ = samples;
    append(row);
  }

 private:
  // Best effort, like the progress line: a step history that cannot be written (a full disk) is
  // given up with one warning, and training goes on.
  void append(const Metrics& row) {
    try {
      MetricsHistory::append_jsonl(file_, row);
    } catch (const std::exception& e) {
      give_up(e);
    }
  }
  // The losses since the last row, summed in double precision on their device.
  torch::Tensor loss_sum() const {
    auto sum = losses_.empty() ? partial_sum_ : torch::stack(losses_).to(torch::kFloat64).sum();
    return partial_sum_.defined() && !losses_.empty() ? sum + partial_sum_ : sum;
  }
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
