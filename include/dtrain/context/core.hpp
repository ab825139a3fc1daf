// SPDX-License-Identifier: Apache-2.0
#pragma once
// ContextCore: the part of a worker's Context (context.hpp) that no policy decides: the group, the
// run's configuration and directory, the epoch cursor, the progress meter, report()'s row and
// timing, the stop protocol and checkpoint loads' errors. Compiled once (in dtrain's library under
// DTRAIN_SEPARATE_COMPILATION); Context<Policies> holds one as its first member and adds the
// policies' states.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/types.h>

#include <dtrain/checkpointer/checkpoint.hpp>
#include <dtrain/checkpointer/snapshot_buffers.hpp>
#include <dtrain/checkpointer/write.hpp>
#include <dtrain/config.hpp>
#include <dtrain/evaluation/classification.hpp>
#include <dtrain/launch/group.hpp>
#include <dtrain/launch/stop.hpp>
#include <dtrain/metrics.hpp>
#include <dtrain/run_directory.hpp>
#include <dtrain/sampler/cursor.hpp>
#include <dtrain/tracking/progress_meter.hpp>
#include <dtrain/tracking/record.hpp>
#include <dtrain/tracking/report_timing.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace detail {

struct ContextCore {
  ContextCore(const launch::WorkerIdentity& who, c10::intrusive_ptr<c10d::Store> store, const ScalingConfig& scaling,
              const RunConfig& run, torch::Device device);

  /// The rest of the start, once the policies' states exist: the counters and the cursor of
  /// `resumed` (none: a fresh start), the history cut back to it, the report timing started.
  /// `deals_from_offset`: the Trainer's Sampler continues an epoch from a global sample offset
  /// (another worker count may then resume mid-epoch).
  void start(const std::optional<checkpointer::Checkpoint>& resumed, bool deals_from_offset);

  /// Whether the loop stops at this step (stop_when()'s rule fired, or a stop request); remembers
  /// which.
  bool stopping();
  void count_step();
  /// global_batch / world_size; ConfigError when the ranks cannot share it evenly.
  std::int64_t batch_size(std::int64_t global_batch) const;

  /// report()'s synchronised start: the barrier, and the row (the loop's metrics with iteration,
  /// epoch, step, timestamp and the times).
  Metrics report_row(const Metrics& metrics);
  /// What report() sums over the ranks: the samples trained since the last report, and rank 0's
  /// stop_when() answer on `row`.
  torch::Tensor report_sums(const Metrics& row);
  /// report()'s end, with `sums` summed over the ranks (on the CPU): the rates, the rule's answer,
  /// and on rank 0 the history's line and the Tracker's report hook (`tracker_report`, or none).
  void report_done(Metrics& row, const torch::Tensor& sums, const Metrics& metrics,
                   void (*tracker_report)(const tracking::RunRecord&, const Metrics&));

  /// finish()'s start (the meter closed, a stop recorded for the driver) and end (the group's
  /// count of reports checked, the metrics table written).
  void finish_meter();
  void finish_group();

  /// Runs `load`. A load error names the file and the checkpoint, and what to do; unless the run's
  /// configuration is at fault (ConfigError), the checkpoint is marked in the store so that the
  /// restarted group passes over it like a damaged one and resumes from an older checkpoint.
  void naming_file(const checkpointer::Checkpoint& ck, const std::string& file, const std::function<void()>& load);
  /// Marks checkpoint `dir` in the store as one the restarted group passes over, `why`.
  void mark_unloadable(const std::filesystem::path& dir, const std::string& why) const;

  /// ctx.record_evaluation() on rank 0.
  void record_evaluation(const std::string& name, const evaluation::ConfusionMatrix& cm,
                         const std::vector<std::string>& class_names, const std::string& checkpoint,
                         const Metrics& extra);

  /// A snapshot's generators, sampler position and steps, and the previous snapshot's buffers done.
  void fill_snapshot(checkpointer::Snapshot& s);

  /// A first step with no gradient at all (no backward ran) gets a warning from rank 0.
  void warn_if_no_gradient(const std::vector<torch::Tensor>& params) const;

  launch::Group group;
  ScalingConfig scaling;
  RunConfig run;
  RunDirectory dir;
  torch::Device device;
  sampler::EpochCursor cursor;
  tracking::ProgressMeter meter;
  tracking::ReportTiming timing;  // the timing columns of every report
  checkpointer::detail::SnapshotBuffers snapshot_buffers;  // the previous snapshot's tensors, to copy into
  std::int64_t steps = 0, reports = 0, syncs = 0;
  double iteration_s = 0;     // the last report's time_this_iter_s
  int group_checkpoints = 0;  // checkpoints this group saved (an elastic group regrows after some)
  bool stopped = false;       // a stop request cut the loop short (stopped())
  bool rule_fired = false;    // the stop_when() rule answered true at a report
  bool cut_by_rule = false;   // ... and the loop asked to go on after it (stopped_by_rule())
  std::function<bool(const Metrics&)> stop_rule;  // stop_when()
  launch::StopRequest stop;
  std::optional<tracking::RunRecord> tracked;  // rank 0: the run as the Tracker's report hook sees it
};

}  // namespace detail

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/context/impl/core.ipp>
#endif
