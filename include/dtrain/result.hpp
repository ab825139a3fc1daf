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
inline nlohmann::json read_json(const std::filesystem::path& path, nlohmann::json fallback = nullptr) {
  std::ifstream in(path);
  if (!in) return fallback;
  try {
    return nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    throw Error(path.string() + ": not valid JSON (" + e.what() + "); was it cut short?");
  }
}
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
  void push_back(Metrics m) { rows_.push_back(std::move(m)); }

  /// Column names, sorted, the union over all rows.
  std::vector<std::string> columns() const {
    std::set<std::string> names;
    for (const auto& r : rows_)
      for (const auto& [k, v] : r) names.insert(k);
    return {names.begin(), names.end()};
  }

  /// One column as numbers; rows without it give NaN.
  std::vector<double> column(std::string_view name) const {
    std::vector<double> out;
    out.reserve(rows_.size());
    for (const auto& r : rows_) {
      auto it = r.find(name);
      out.push_back(it == r.end() || !it->second.is_number() ? std::numeric_limits<double>::quiet_NaN()
                                                            : it->second.number());
    }
    return out;
  }

  /// Reads a JSON Lines file written by append_jsonl; a missing file is an empty history.
  static MetricsHistory read_jsonl(const std::filesystem::path& path) {
    MetricsHistory h;
    std::ifstream in(path);
    std::string line;
    for (std::size_t n = 1; std::getline(in, line); ++n) {
      if (line.empty()) continue;
      try {
        h.rows_.push_back(nlohmann::json::parse(line).get<Metrics>());
      } catch (const std::exception& e) {  // not JSON, or a value that is not a metric
        throw Error(path.string() + ":" + std::to_string(n) + ": not a metrics row (" + e.what() + ")");
      }
    }
    return h;
  }

  /// Cuts a JSON Lines history back to the rows whose `column` (metrics.jsonl's "iteration",
  /// steps.jsonl's "step") is at most `last` (a resumed run continues after its checkpoint); with
  /// none left the file is removed.
  static void truncate_jsonl(const std::filesystem::path& path, std::string_view column, std::int64_t last) {
    MetricsHistory kept;
    const auto history = read_jsonl(path);  // a range-for over read_jsonl(path).rows() would dangle
    if (last > 0)
      for (const auto& row : history.rows()) {
        auto it = row.find(column);
        if (it != row.end() && it->second.is_number() && it->second.number() <= static_cast<double>(last))
          kept.push_back(row);
      }
    std::error_code ec;
    const auto tmp = path.string() + ".tmp";
    std::filesystem::remove(tmp, ec);
    for (const auto& row : kept.rows()) append_jsonl(tmp, row);
    if (kept.empty()) std::filesystem::remove(path, ec);
    else std::filesystem::rename(tmp, path);
  }

  static void append_jsonl(const std::filesystem::path& path, const Metrics& row) {
    std::ofstream out(path, std::ios::app);
    out << nlohmann::json(row).dump() << '\n';
    if (!out) throw Error(path.string() + ": cannot append a metrics row (disk full or read-only?)");
  }

  /// Writes the table as CSV: a header of columns(), then one line per row, empty where a row lacks
  /// a column. Text is quoted when it holds a comma, a quote or a line break.
  void write_csv(const std::filesystem::path& path) const {
    const auto cols = columns();
    std::ofstream out(path, std::ios::trunc);
    auto quoted = [](const std::string& s) {
      if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
      std::string q = "\"";
      for (char c : s) q += (c == '"' ? std::string("\"\"") : std::string(1, c));
      return q + "\"";
    };
    for (std::size_t i = 0; i < cols.size(); ++i) out << (i ? "," : "") << quoted(cols[i]);
    out << '\n';
    for (const auto& r : rows_) {
      for (std::size_t i = 0; i < cols.size(); ++i) {
        if (i) out << ',';
        if (auto it = r.find(cols[i]); it != r.end()) out << quoted(it->second.text());
      }
      out << '\n';
    }
    if (!out) throw Error(path.string() + ": cannot write the metrics table");
  }

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
  static std::vector<Evaluation> from_json(const nlohmann::json& list, const std::string& source) {
    std::vector<Evaluation> out;
    try {
      for (const auto& e : list)
        out.push_back({e.at("name").get<std::string>(), e.at("metrics").get<Metrics>(),
                       e.value("class_names", std::vector<std::string>{}),
                       e.value("confusion_matrix", std::vector<std::vector<std::int64_t>>{}),
                       e.value("checkpoint", std::string())});
    } catch (const std::exception& e) {
      throw Error(source + ": not an evaluations file (" + e.what() + ")");
    }
    return out;
  }
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
  static std::vector<GroupStart> list_from_json(const nlohmann::json& list) {
    std::vector<GroupStart> out;
    if (!list.is_array()) return out;
    for (const auto& g : list)
      out.push_back({g.value("attempt", 0), g.value("world_size", 0), g.value("step", std::int64_t{0}),
                     g.value("reason", std::string())});
    return out;
  }
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

  static RunFiles read(const std::filesystem::path& run_dir, bool with_checkpoints) {
    const RunDirectory dir(run_dir);
    RunFiles f;
    f.history = MetricsHistory::read_jsonl(dir.history());
    if (auto doc = detail::read_json(dir.evaluations()); doc.is_object())
      f.evaluations = doc.value("evaluations", nlohmann::json::array());
    if (!with_checkpoints) return f;
    f.checkpoints = checkpointer::all_valid(run_dir, /*warn=*/true);
    try {
      if (auto stats = detail::read_json(dir.checkpoint_stats()); !stats.is_null())
        f.checkpoint_stats = stats.get<checkpointer::CheckpointStats>();
    } catch (const std::exception&) {  // unreadable: the stats are optional
    }
    return f;
  }

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
  void set_checkpoints(const std::vector<Checkpoint>& valid, const CheckpointConfig& config) {
    latest_ = valid.empty() ? std::nullopt : std::optional<Checkpoint>(valid.front());
    best_ = checkpointer::best_of(valid, config);
    ranked_ = valid;
    const bool higher = config.score_order == ScoreOrder::max;
    std::stable_sort(ranked_.begin(), ranked_.end(), [&](const Checkpoint& a, const Checkpoint& b) {
      return checkpointer::scores_better(a.metrics(), a.iteration(), b.metrics(), b.iteration(),
                                         config.score_attribute, higher);
    });
  }

  /// The Result of a run directory's files: what fit() returned when the run ended (finished,
  /// failed or stopped; interrupted when its driver was killed), rebuilt from metrics.jsonl, outcome.json, params.json's checkpoint
  /// config, evaluations.json and the checkpoints. Throws Error when `run_dir` is not a run
  /// directory. Without `with_checkpoints` no checkpoint is read (nor verified): the Result has
  /// none, and is read in the time its JSON files take.
  static Result from_path(const std::filesystem::path& run_dir, bool with_checkpoints = true) {
    const RunDirectory dir(run_dir);
    const auto outcome = detail::read_json(dir.outcome());
    if (!outcome.is_object())
      throw Error(dir.outcome().string() + " is missing: " + run_dir.string() +
                  " is not a run directory written by fit() with a Tracker that records the outcome "
                  "(tracker::directory, tracker::mlflow<> or tracker::tensorboard<>)");
    CheckpointConfig config;
    if (auto params = detail::read_json(dir.params()); params.is_object() && params.contains("checkpoint")) {
      const auto& c = params.at("checkpoint");
      config.num_to_keep = c.value("num_to_keep", 0);
      config.score_attribute = c.value("score_attribute", std::string());
      config.score_order = c.value("score_order", std::string("max")) == "min" ? ScoreOrder::min : ScoreOrder::max;
    }
    std::optional<RunError> error;
    auto status = outcome.value("status", std::string("running"));
    // "running" stays on disk when the driver was killed: ask whether it still runs.
    if (const auto gone = launch::driver_gone(outcome, unix_now())) {
      status = "interrupted";
      error = RunError{status, "run " + run_dir.string() + " was interrupted: " + *gone + ". Run it again (the same "
                       "storage path and name) to resume from its latest checkpoint", -1};
    }
    if (status == "failed" || status == "stopped") {
      const auto& e = outcome.value("error", nlohmann::json());
      const auto& r = outcome.value("error_rank", nlohmann::json());
      error = RunError{status, e.is_string() ? e.get<std::string>() : status, r.is_number_integer() ? r.get<int>() : -1};
    }
    auto r = assemble(RunFiles::read(run_dir, with_checkpoints), run_dir, config,
                      outcome.value("restarts", 0), status, std::move(error));
    r.groups = GroupStart::list_from_json(outcome.value("groups", nlohmann::json()));
    return r;
  }

  /// A Result from what was read of the run directory (fit() and from_path share it).
  static Result assemble(const RunFiles& files, const std::filesystem::path& run_dir, const CheckpointConfig& config,
                         int restarts, std::string status, std::optional<RunError> error) {
    Result r;
    r.path = run_dir;
    r.restarts = restarts;
    r.status = std::move(status);
    r.error = std::move(error);
    r.metrics_history = files.history;
    if (!r.metrics_history.empty()) r.metrics = r.metrics_history.rows().back();
    r.evaluations = Evaluation::from_json(files.evaluations, RunDirectory(run_dir).evaluations().string());
    r.set_checkpoints(files.checkpoints, config);
    r.checkpoint_stats = files.checkpoint_stats;
    return r;
  }

 private:
  std::optional<Checkpoint> latest_, best_;
  std::vector<Checkpoint> ranked_;
};

DTRAIN_NAMESPACE_END
