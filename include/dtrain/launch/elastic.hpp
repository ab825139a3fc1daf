// SPDX-License-Identifier: Apache-2.0
#pragma once
// Elastic groups under dtrain's own driver: how many workers the next group gets, between
// ScalingConfig::min_workers and num_workers, and how a smaller group hands over to a full one.
//
// The rule, from what the driver can observe (docs/multi-host.md, "Elastic groups"):
// - A worker is lost when the same rank ends the group twice in a row with no newer checkpoint
//   between: the restart brought nothing back. The next group has one worker fewer, never fewer
//   than min_workers. (A worker the driver cannot start, fork or exec failing, fails the group as
//   that rank, every time.)
// - A smaller group grows back at its regrow_after_checkpoints-th checkpoint: every rank stops right
//   after that checkpoint is complete (launch::Regroup), and the driver starts num_workers workers
//   that resume from it. If the lost worker fails again, the rule above shrinks the group again;
//   every failure counts against FailureConfig::max_failures.

#include <cstdint>
#include <optional>
#include <string>

#include <dtrain/config.hpp>
#include <dtrain/error.hpp>
#include <dtrain/launch/environment.hpp>
#include <dtrain/launch/process.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace launch {

/// Thrown on every rank of a smaller group right after the checkpoint at which it grows back; the
/// worker ends with status 0 and the driver starts the full group. Not a std::exception, so a loop's
/// `catch (const std::exception&)` lets it through (a `catch (...)` that swallows it stops the
/// grow-back: rethrow what you do not handle).
struct Regroup {};

/// The store key (of the group's attempt) by which rank 0 tells the driver its group stopped to grow.
inline constexpr const char* regroup_key = "regroup";

/// Whether a group of `who.world_size` workers started by dtrain's driver grows back after its
/// `checkpoints`-th checkpoint (every rank computes the same answer, with no store read).
inline bool regrow_due(const WorkerIdentity& who, const ScalingConfig& scaling, int checkpoints) {
  return who.store_on_driver && who.world_size < scaling.num_workers && checkpoints >= scaling.regrow_after_checkpoints;
}

/// An elastic range needs checkpoints to resume from, and optimizer state that a group of another
/// size can load: whole, or sharded by a Strategy that re-shards it (strategy::fsdp<> does).
void check_elastic(const ScalingConfig& scaling, bool persists, bool shards_optimizer,
                   bool reshards_optimizer = false);

/// The driver's choice of each group's size, and why it changed.
class ElasticSize {
 public:
  explicit ElasticSize(const ScalingConfig& scaling)
      : min_(scaling.minimum_workers()), max_(scaling.num_workers), size_(scaling.num_workers) {}

  int size() const { return size_; }

  /// After a failed group whose end `rank` caused, when the latest checkpoint is at `latest_step`:
  /// "shrink" when that rank also ended the group before, with no newer checkpoint between (and
  /// the group is above min_workers), else "restart" (the same size again).
  std::string after_failure(int rank, std::int64_t latest_step);

  /// After a smaller group stopped at a checkpoint to grow back.
  std::string after_regroup() {
    size_ = max_;
    last_rank_ = -1;
    return "grow";
  }

 private:
  int min_, max_, size_;
  int last_rank_ = -1;
  std::optional<std::int64_t> last_step_;
};

/// The worker that caused a group's end, given the first one `poll()` found ended abnormally: a
/// rank killed by a signal that the driver did not send, if one has ended by now, rather than a
/// rank that exited with an error because it lost that peer (which poll() may find first: it
/// looks at the ranks in order).
ExitStatus first_cause(WorkerGroup& group, ExitStatus first);

}  // namespace launch

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/launch/impl/elastic.ipp>
#endif
