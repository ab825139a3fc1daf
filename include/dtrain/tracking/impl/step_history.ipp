// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of step_history.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/tracking/step_history.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace tracking {

DTRAIN_INLINE void StepHistory::group_started(std::int64_t step, std::int64_t epoch, int attempt, int world_size) {
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

DTRAIN_INLINE void StepHistory::on_backward(const torch::Tensor& loss) {
  if (!enabled() || loss.numel() != 1) return;
  losses_.push_back(loss.dim() == 0 ? loss.detach() : loss.detach().reshape({}));
  ++loss_count_;
  if (losses_.size() >= 256) {  // a long interval keeps a partial sum, not every loss
    partial_sum_ = loss_sum();
    losses_.clear();
  }
}

DTRAIN_INLINE void StepHistory::log(const Metrics& values) {
  if (!enabled()) return;
  for (const auto& [k, v] : values) logged_.insert_or_assign(k, v);
}

DTRAIN_INLINE void StepHistory::on_step(std::int64_t step, std::int64_t epoch, std::int64_t samples) {
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

DTRAIN_INLINE void StepHistory::append(const Metrics& row) {
  try {
    MetricsHistory::append_jsonl(file_, row);
  } catch (const std::exception& e) {
    give_up(e);
  }
}

DTRAIN_INLINE torch::Tensor StepHistory::loss_sum() const {
  auto sum = losses_.empty() ? partial_sum_ : torch::stack(losses_).to(torch::kFloat64).sum();
  return partial_sum_.defined() && !losses_.empty() ? sum + partial_sum_ : sum;
}
}  // namespace tracking
DTRAIN_NAMESPACE_END
