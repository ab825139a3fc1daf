// SPDX-License-Identifier: Apache-2.0
#pragma once
// Result: what fit() returns to the driver, built from what rank 0 persisted.

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include <dtrain/checkpointer/checkpoint.hpp>
#include <dtrain/checkpointer/selection.hpp>
#include <dtrain/checkpointer/retention.hpp>
#include <dtrain/config.hpp>
#include <dtrain/error.hpp>
#include <dtrain/launch/liveness.hpp>
#include <dtrain/metrics.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace detail {
/// The JSON in `path`, or `fallback` when the file is absent. A file that is there but is not
/// JSON throws Error naming it.
nlohmann::json read_json(const std::filesystem::path& path, nlohmann::json fallback = nullptr);
}  // namespace detail

/// Every report() of rank 0, in order: a table whose rows are Metrics and whose columns are the
/// union of their names.
class MetricsHistory {
 public:
  MetricsHistory() = default;
  explicit MetricsHistory(std::vector<Metrics> rows) : rows_(std::move(rows)) {}

  const std::vector<Metrics>& rows() const { return rows_; }
  std::size_t size() const { return rows_.size(); }
  bool empty() const { return rows_.empty(); }
  const Metrics& operator[](std::size_t i) const { return rows_.at(i); }
  /// The rows in report order: `for (const auto& row : result.metrics_history)`.
  auto begin() const { return rows_.begin(); }
  auto end() const { return rows_.end(); }
  void push_back(Metrics m) { rows_.push_back(std::move(m)); }

  /// Column names, sorted, the union over all rows.
  std::vector<std::string> columns() const;

  /// One column as numbers; rows without it give NaN.
  std::vector<double> column(std::string_view name) const;

  /// Reads a JSON Lines file written by append_jsonl; a missing file is an empty history.
  static MetricsHistory read_jsonl(const std::filesystem::path& path);

  /// Cuts a JSON Lines history back to the rows whose `column` (metrics.jsonl's "iteration",
  /// steps.jsonl's "step") is at most `last` (a resumed run continues after its checkpoint); with
  /// none left the file is removed.
  static void truncate_jsonl(const std::filesystem::path& path, std::string_view column, std::int64_t last);

  static void append_jsonl(const std::filesystem::path& path, const Metrics& row);

  /// Writes the table as CSV: a header of columns(), then one line per row, empty where a row lacks
  /// a column. Text is quoted when it holds a comma, a quote or a line break.
  void write_csv(const std::filesystem::path& path) const;

 private:
  std::vector<Metrics> rows_;
};

/// An evaluation recorded with ctx.record_evaluation (the run directory's evaluations.json).
struct Evaluation {
  std::string name;
  /// accuracy, precision_macro, recall_macro, f1_macro, precision_weighted, recall_weighted,
  /// f1_weighted, and the extras recorded with them.
  Metrics metrics;
  std::vector<std::string> class_names;
  /// confusion_matrix[t][p]: samples of true class t predicted as p.
  std::vector<std::vector<std::int64_t>> confusion_matrix;
  /// The checkpoint evaluated (empty when none was named).
  std::string checkpoint;

  /// The evaluations of evaluations.json's "evaluations" array (`source` names it in errors).
  static std::vector<Evaluation> from_json(const nlohmann::json& list, const std::string& source);
};

/// A checkpoint directory: path(), metrics(), load_model(module), restore(model, optimizer).
using Checkpoint = checkpointer::Checkpoint;

/// Why a run did not finish: Result::error, when FailureConfig::throw_on_failure is false.
struct RunError {
  /// "failed" (a worker failed more often than max_failures allows, or the group could not be
  /// started), "stopped" (SIGINT or SIGTERM to the driver) or, read back by Result::from_path,
  /// "interrupted" (the driver ended without recording the run's end: killed by SIGKILL, or lost
  /// with its machine).
  std::string status = "failed";
  /// The whole message fit() would have thrown: the rank, how it ended, the first error.
  std::string message;
  /// The rank whose failure ended the run; -1 when no single rank did (a stop, a start failure).
  int rank = -1;
};

/// One worker group of a run (outcome.json's "groups", in order): when the driver started it, how
/// big, and why. Under a launcher rank 0 records each group the launcher started.
struct GroupStart {
  /// The group's attempt (ctx.attempt()): 0 for the first group, one more for each start after.
  int attempt = 0;
  int world_size = 0;
  /// The step of the checkpoint it resumed from (0: from the start).
  std::int64_t step = 0;
  /// "start" (the first), "restart" (after a failure, the same size), "shrink" (after a worker was
  /// lost, one fewer), "grow" (a smaller group reached its checkpoints; back to num_workers).
  std::string reason;

  /// The groups of outcome.json's "groups" array (absent in older files: none).
  static std::vector<GroupStart> list_from_json(const nlohmann::json& list);
};

/// A run directory's files, read once: for the Result and for the Tracker alike.
struct RunFiles {
  MetricsHistory history;
  /// evaluations.json's "evaluations" array.
  nlohmann::json evaluations = nlohmann::json::array();
  /// The checkpoints whose manifest verifies, newest first (each verified once; damaged ones are
  /// reported on stderr and passed over).
  std::vector<Checkpoint> checkpoints;
  std::optional<checkpointer::CheckpointStats> checkpoint_stats;

  static RunFiles read(const std::filesystem::path& run_dir, bool with_checkpoints);

};

/// The outcome of Trainer::fit(), in the driver, or of a run read back with Result::from_path.
struct Result {
  /// The last metrics rank 0 reported (empty if it never reported).
  Metrics metrics;
  /// Every report of rank 0, in order; also written to `path / "metrics.csv"` and
  /// `path / "metrics.jsonl"`.
  MetricsHistory metrics_history;
  /// storage_path / name: where this run's files are.
  std::filesystem::path path;
  /// How many times the worker group was restarted after a failure (a checkpoint that could not
  /// be loaded included, which does not count against FailureConfig::max_failures).
  int restarts = 0;
  /// "finished", "failed" or "stopped" (outcome.json's status). Read back with from_path also
  /// "running" while the run still runs, and "interrupted" when outcome.json says running but
  /// its driver is gone (killed by SIGKILL, or lost with its machine: launch/liveness.hpp).
  std::string status = "finished";
  /// Why the run did not finish, when fit() was asked not to throw
  /// (FailureConfig::throw_on_failure = false) or the run was read back with from_path.
  std::optional<RunError> error;
  /// Under checkpointer::directory<>: how long rank 0's training thread was held up by
  /// checkpoints, and how long their writes took (the last group's, from checkpoint_stats.json).
  std::optional<checkpointer::CheckpointStats> checkpoint_stats;
  /// The evaluations the loop recorded with ctx.record_evaluation, in the order first recorded.
  std::vector<Evaluation> evaluations;
  /// Every worker group of the run in order, with its size: restarts and an elastic run's changes
  /// of size (ScalingConfig::min_workers).
  std::vector<GroupStart> groups;

  /// The evaluation named `name`, or nullptr.
  const Evaluation* evaluation(std::string_view name) const {
    for (const auto& e : evaluations)
      if (e.name == name) return &e;
    return nullptr;
  }

  /// The newest checkpoint of the run whose manifest verifies (checkpointer::directory<>).
  const std::optional<Checkpoint>& latest_checkpoint() const { return latest_; }
  /// The best checkpoint by CheckpointConfig::score_attribute and score_order (the latest when no
  /// score attribute is set).
  const std::optional<Checkpoint>& best_checkpoint() const { return best_; }
  /// Every valid checkpoint of the run, each with its metrics(), in retention order: best first
  /// by score_attribute and score_order (newest first when no score attribute is set), as
  /// CheckpointConfig::num_to_keep ranks them. best_checkpoints().front() is best_checkpoint().
  const std::vector<Checkpoint>& best_checkpoints() const { return ranked_; }
  /// Sets latest, best and the ranked list from the valid checkpoints (newest first).
  void set_checkpoints(const std::vector<Checkpoint>& valid, const CheckpointConfig& config);

  /// The Result of a run directory's files: what fit() returned when the run ended (finished,
  /// failed or stopped; interrupted when its driver was killed), rebuilt from metrics.jsonl, outcome.json, params.json's checkpoint
  /// config, evaluations.json and the checkpoints. Throws Error when `run_dir` is not a run
  /// directory. Without `with_checkpoints` no checkpoint is read (nor verified): the Result has
  /// none, and is read in the time its JSON files take.
  static Result from_path(const std::filesystem::path& run_dir, bool with_checkpoints = true);

  /// A Result from what was read of the run directory (fit() and from_path share it).
  static Result assemble(const RunFiles& files, const std::filesystem::path& run_dir, const CheckpointConfig& config,
                         int restarts, std::string status, std::optional<RunError> error);

 private:
  std::optional<Checkpoint> latest_, best_;
  std::vector<Checkpoint> ranked_;
};

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/impl/result.ipp>
#endif
