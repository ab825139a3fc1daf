// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of config.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/config.hpp>

DTRAIN_NAMESPACE_BEGIN

DTRAIN_INLINE void ScalingConfig::validate() const {
  if (num_workers < 1)
    throw ConfigError("ScalingConfig::num_workers is " + std::to_string(num_workers) +
                      "; it must be at least 1");
  if (min_workers && (*min_workers < 1 || *min_workers > num_workers))
    throw ConfigError("ScalingConfig::min_workers is " + std::to_string(*min_workers) + " with num_workers " +
                      std::to_string(num_workers) + "; set 1 <= min_workers <= num_workers (num_workers is the "
                      "most workers, min_workers the fewest an elastic run continues with), or leave it unset "
                      "for a fixed size");
  if (regrow_after_checkpoints < 1)
    throw ConfigError("ScalingConfig::regrow_after_checkpoints is " + std::to_string(regrow_after_checkpoints) +
                      "; it must be at least 1 (the checkpoints a smaller group writes before it grows back)");
  if (threads_per_worker < 1)
    throw ConfigError("ScalingConfig::threads_per_worker is " + std::to_string(threads_per_worker) +
                      "; it must be at least 1");
}

DTRAIN_INLINE void FailureConfig::validate() const {
  if (max_failures < -1)
    throw ConfigError("FailureConfig::max_failures is " + std::to_string(max_failures) +
                      "; use -1 (unlimited), 0 (no restarts) or a positive count");
  if (stop_grace.count() < 0 || stop_poll.count() <= 0)
    throw ConfigError("FailureConfig: stop_grace must be zero or positive and stop_poll positive (stop_grace " +
                      std::to_string(stop_grace.count()) + " ms, stop_poll " + std::to_string(stop_poll.count()) +
                      " ms)");
  if (restart_backoff.count() < 0 || restart_backoff_max < restart_backoff)
    throw ConfigError("FailureConfig: restart_backoff must be >= 0 and restart_backoff_max >= restart_backoff");
  if (heartbeat_timeout.count() < 0)
    throw ConfigError("FailureConfig::heartbeat_timeout is " + std::to_string(heartbeat_timeout.count()) +
                      " ms; use 0 (off) or a positive time");
  if (progress_timeout.count() < 0)
    throw ConfigError("FailureConfig::progress_timeout is " + std::to_string(progress_timeout.count()) +
                      " ms; use 0 (off) or a positive time, longer than the train loop's longest stretch "
                      "without a batch, collective or report");
  if (max_repeated_failures < 0)
    throw ConfigError("FailureConfig::max_repeated_failures is " + std::to_string(max_repeated_failures) +
                      "; use 0 (never stop on repeats) or a positive count");
}

DTRAIN_INLINE void ProgressConfig::validate() const {
  if (interval.count() <= 0 || refresh.count() <= 0)
    throw ConfigError("ProgressConfig: interval and refresh must be positive durations");
  if (record_every < 0)
    throw ConfigError("ProgressConfig::record_every is " + std::to_string(record_every) +
                      "; use a number of optimizer steps, or 0 to record no step history");
}

DTRAIN_INLINE void RunConfig::validate() const {
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
    throw ConfigError("RunConfig::name \"" + name +
                      "\" must be a single, non-empty directory name (no '/')");
  if (rendezvous_timeout.count() <= 0 || collective_timeout.count() <= 0)
    throw ConfigError("RunConfig: rendezvous_timeout and collective_timeout must be positive");
  checkpoint.validate();
  failure.validate();
  progress.validate();
}
DTRAIN_NAMESPACE_END
