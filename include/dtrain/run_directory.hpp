// SPDX-License-Identifier: Apache-2.0
#pragma once
// RunDirectory: every path of a run, in one place. storage_path/name/ holds
//
//   checkpoint_NNNNNN/   one per kept checkpoint (checkpointer/checkpoint.hpp has the layout);
//                        NNNNNN is the report iteration, zero-padded
//   .tmp_checkpoint_NNNNNN/  a checkpoint being written (renamed into place when complete)
//   NAME.tmp           a file being written atomically (renamed to NAME when complete)
//   checkpoint_stats.json    how long checkpoints held up training (the last group's)
//   params.json        the run's parameters: policies, ScalingConfig, RunConfig, train_loop_config
//   metrics.jsonl      one JSON object per report() of rank 0
//   steps.jsonl        rank 0's loss and throughput every ProgressConfig::record_every steps, and
//                      each worker group's start
//   metrics.csv        the same table as CSV, written when the loop ends
//   checkpoints.json   the index of valid checkpoints with their scores, the latest and the best
//   evaluations.json   evaluations recorded with ctx.record_evaluation
//   outcome.json       running / finished / failed (with the cause), restarts and their causes
//   report.html        the self-contained HTML report
//   ../mlruns/         under tracker::mlflow<>: MLflow's file store, one per storage path (a
//                      Tuner's trials: one per experiment, the trials its runs)
//   tensorboard/       under tracker::tensorboard<>: TensorBoard's event files
//
// docs/run-directory.md describes each file's fields for readers in other languages.

#include <sys/stat.h>
#include <sys/types.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <dtrain/config.hpp>
#include <dtrain/error.hpp>

DTRAIN_NAMESPACE_BEGIN

/// Adds "others may not write" to this process's umask (022 and 077 stay; 000 becomes 002), so that
/// no directory or file of a run (checkpoints, records, shared-memory segments) is world-writable,
/// whatever umask the run was started under. fit() calls it first, on the driver and every worker.
inline void deny_world_write() {
  const ::mode_t old = ::umask(0);
  ::umask(old | S_IWOTH);
}

class RunDirectory {
 public:
  RunDirectory() = default;
  explicit RunDirectory(std::filesystem::path root) : root_(std::move(root)) {}

  const std::filesystem::path& path() const { return root_; }

  /// The experiment the run belongs to (tracker::mlflow<>'s experiment): the Tuner experiment's
  /// name when the run is one of its trials (its storage path is the experiment's directory,
  /// which holds tuner.json), else the run's own name.
  std::string experiment_name() const;

  /// Creates the directory (and its parents); a path that cannot be one is a ConfigError naming it.
  void create() const;

  /// Renames an existing run directory to "<name>.old-<UTC time>" beside it (RunConfig::start =
  /// Start::fresh), deleting nothing; returns the new path, or nothing when there was no directory.
  std::optional<std::filesystem::path> move_aside() const;

  /// @name The run's files
  /// @{
  std::filesystem::path params() const { return root_ / "params.json"; }
  std::filesystem::path history() const { return root_ / "metrics.jsonl"; }
  std::filesystem::path step_history() const { return root_ / "steps.jsonl"; }
  std::filesystem::path history_table() const { return root_ / "metrics.csv"; }
  std::filesystem::path checkpoint_index() const { return root_ / "checkpoints.json"; }
  std::filesystem::path checkpoint_stats() const { return root_ / "checkpoint_stats.json"; }
  std::filesystem::path evaluations() const { return root_ / "evaluations.json"; }
  std::filesystem::path outcome() const { return root_ / "outcome.json"; }
  std::filesystem::path report() const { return root_ / "report.html"; }
  /// MLflow's file store of tracker::mlflow<>: the storage path's, shared by its runs.
  std::filesystem::path mlruns() const { return root_.parent_path() / "mlruns"; }
  /// @}

  /// @name Checkpoint directories
  /// @{
  /// "checkpoint_000042" for iteration 42.
  static std::string checkpoint_name(std::int64_t iteration);
  /// The iteration a "checkpoint_NNNNNN" directory name stands for, or nothing for other names.
  static std::optional<std::int64_t> iteration_of(std::string_view dir_name);
  std::filesystem::path checkpoint(std::int64_t iteration) const { return root_ / checkpoint_name(iteration); }
  std::filesystem::path temporary_checkpoint(std::int64_t iteration) const {
    return root_ / (temporary_prefix + checkpoint_name(iteration));
  }

  /// The checkpoint directories, newest first by iteration (not verified).
  std::vector<std::pair<std::int64_t, std::filesystem::path>> checkpoints() const;

  /// Removes what writes cut short left behind (a full disk, a killed process): the
  /// .tmp_checkpoint_* directories and the temporary files of atomic writes (NAME.tmp). Only while
  /// nothing writes into the run: before a group starts or after it ended. Returns the names
  /// removed, comma-separated ("" when none).
  std::string remove_unfinished_writes() const;

  /// Removes what a checkpoint write cut short left behind (.tmp_checkpoint_* directories).
  void remove_unfinished_checkpoints() const;
  /// @}

 private:
  static constexpr const char* temporary_prefix = ".tmp_";
  std::filesystem::path root_;
};

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/impl/run_directory.ipp>
#endif
