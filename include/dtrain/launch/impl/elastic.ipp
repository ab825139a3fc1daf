// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of elastic.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/launch/elastic.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace launch {

DTRAIN_INLINE void check_elastic(const ScalingConfig& scaling, bool persists, bool shards_optimizer,
                                 bool reshards_optimizer) {
  if (!scaling.elastic()) return;
  const std::string range = "ScalingConfig::min_workers = " + std::to_string(scaling.minimum_workers()) +
                            " < num_workers = " + std::to_string(scaling.num_workers);
  if (!persists)
    throw ConfigError(range + " makes the group elastic, which resumes each smaller or larger group from the "
                      "latest checkpoint; add dtrain::checkpointer::directory<> to the Trainer's policies, or "
                      "leave min_workers unset");
  if (shards_optimizer && !reshards_optimizer)
    throw ConfigError(range + ", but the Trainer's Strategy shards the optimizer state over the ranks and "
                      "cannot re-shard it (no reshards_optimizer), so its checkpoint resumes only with the world "
                      "size that wrote it; use strategy::ddp<> or strategy::fsdp<> (which re-shards), or leave "
                      "min_workers unset");
}

DTRAIN_INLINE std::string ElasticSize::after_failure(int rank, std::int64_t latest_step) {
  const bool again = last_rank_ == rank && last_step_ == latest_step;
  last_rank_ = rank;
  last_step_ = latest_step;
  if (!again || size_ <= min_) return "restart";
  --size_;
  last_rank_ = -1;  // the smaller group starts its own count
  return "shrink";
}

DTRAIN_INLINE ExitStatus first_cause(WorkerGroup& group, ExitStatus first) {
  ExitStatus cause = first;
  while (auto other = group.poll()) {
    if (WIFSIGNALED(other->status) && !WIFSIGNALED(cause.status)) cause = *other;
  }
  return cause;
}
}  // namespace launch
DTRAIN_NAMESPACE_END
