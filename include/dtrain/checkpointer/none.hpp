// SPDX-License-Identifier: Apache-2.0
#pragma once
// checkpointer::none: no checkpoints are written; a run cannot resume.

#include <cstdint>
#include <optional>

#include <dtrain/checkpointer/checkpoint.hpp>
#include <dtrain/checkpointer/write.hpp>
#include <dtrain/config.hpp>
#include <dtrain/error.hpp>
#include <dtrain/launch/group.hpp>
#include <dtrain/metrics.hpp>
#include <dtrain/policy/category.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace checkpointer {

/// Writes nothing. report(metrics) records metrics only; a failed run starts over.
///
/// Its `state` spells out the whole interface of a checkpointer's per-worker state: use it as the
/// template for your own (concept/checkpointer.hpp states the laws a state must keep).
struct none {
  using category = dtrain::category::checkpointer;
  static constexpr const char* name = "none";

  class state {
   public:
    /// Whether checkpoints are written and read. ctx.checkpoint(), ctx.report(metrics, snapshot)
    /// and ctx.best_checkpoint() fail to compile when it is false.
    static constexpr bool persists = false;

    /// Made once per worker group, on every rank, before the train loop runs. A checkpointer that
    /// resumes chooses its checkpoint here (every rank must get the same answer: group.decide()).
    state(const launch::Group& /*group*/, const RunConfig& /*run*/) {}

    /// The checkpoint this group resumes from, or nothing for a fresh start.
    const std::optional<Checkpoint>& resumed() const { return resumed_; }

    /// Saves `snapshot` (every rank's, from ctx.checkpoint()) as checkpoint `iteration` with the
    /// metrics rank 0 reported. May return before the files are written; wait() waits for them.
    void save(Snapshot&& /*snapshot*/, std::int64_t iteration, const Metrics& /*reported*/) {
      throw ConfigError("checkpointer::none cannot save checkpoint " + std::to_string(iteration) +
                        "; add dtrain::checkpointer::directory<> to the Trainer's policies");
    }

    /// Waits for the save in flight, if any, and rethrows its error.
    void wait() {}

    /// The best complete checkpoint by RunConfig::checkpoint, after wait(); every rank calls it.
    std::optional<Checkpoint> best() const { return std::nullopt; }

    /// Seconds the training thread spent taking a snapshot, counted into stats().blocked_s.
    void add_blocked(double /*seconds*/) {}
    const CheckpointStats& stats() const { return stats_; }

    /// The end of the train loop on this rank: waits for the last save and records the stats.
    void finish() {}

   private:
    std::optional<Checkpoint> resumed_;
    CheckpointStats stats_;
  };
};

}  // namespace checkpointer

DTRAIN_NAMESPACE_END
