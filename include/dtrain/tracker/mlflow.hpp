// SPDX-License-Identifier: Apache-2.0
#pragma once
// tracker::mlflow<>: the run directory's files, and the same run in MLflow's file-store layout,
// so that `mlflow ui --backend-store-uri <storage path>/mlruns` shows it (MLflow >= 3.13 with
// MLFLOW_ALLOW_FILE_STORE=true). No MLflow is needed to write it: the layout is the one
// mlflow/store/tracking/file_store.py reads. One store per storage path, one experiment per run
// name, one MLflow run per fit() of that name: runs of one storage path appear side by side.
//
// <storage path>/mlruns/
//   .trash/
//   <experiment_id>/meta.yaml          artifact_location, creation_time, experiment_id,
//                                      last_update_time, lifecycle_stage, name
//   <experiment_id>/tags/mlflow.experimentKind   custom_model_development (MLflow 3's UI)
//   <experiment_id>/<run_id>/meta.yaml artifact_uri, end_time, entry_point_name, experiment_id,
//                                      lifecycle_stage, run_id, run_name, run_uuid, source_name,
//                                      source_type, source_version, start_time, status, tags,
//                                      user_id, deleted_time
//     params/<key>                     the value, as text
//     metrics/<key>                    lines "<timestamp ms> <value> <step>", one appended per report
//     tags/<key>                       mlflow.runName, mlflow.user, mlflow.source.name, ...
//     artifacts/                       report.html, metrics.csv, steps.jsonl and the run's JSON files

#include <pwd.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <dtrain/policy/category.hpp>
#include <dtrain/run_directory.hpp>
#include <dtrain/tracker/directory.hpp>
#include <dtrain/tracking/record.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace tracker {

namespace mlflow_detail {

namespace fs = std::filesystem;

/// MLflow's RunStatus values as meta.yaml stores them.
enum class run_status : int { running = 1, scheduled = 2, finished = 3, failed = 4, killed = 5 };

std::string quoted(const std::string& s);

/// A metric, param or tag name as every MLflow release accepts it (alphanumerics, '_', '-', '.',
/// ' ', '/'), other characters replaced by '_' (':' too: releases before mid-2024 reject it, and
/// one such key keeps the whole run list from loading); no leading '/' and no "..", which
/// file_store.py rejects.
std::string key(const std::string& name);

/// A stable run id (32 hex digits, as uuid4().hex): the run directory and its start time.
std::string run_id(const fs::path& run_dir, std::int64_t start_ms);

inline std::string file_uri(const fs::path& p) { return "file://" + fs::absolute(p).lexically_normal().string(); }

std::string value_text(double v);

inline void write_text(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  tracking::write_atomically(p, text);
}

/// Writes `text` to `p` unless it exists: an experiment's files, which concurrent runs (a Tuner's
/// trials) may create at the same moment; the first one written stays, whole.
void write_once(const fs::path& p, const std::string& text);

inline std::int64_t ms(double unix_s) { return static_cast<std::int64_t>(std::llround(unix_s * 1000.0)); }

std::string user();

std::string program();

/// A stable experiment id for a run name (MLflow's file store ids are decimal integers): the same
/// name always lands in the same experiment.
std::string experiment_id(const std::string& name);

/// Appends one report's lines to `lines` (by key): every numeric metric but the bookkeeping ones.
void add_row(std::map<std::string, std::string>& lines, const Metrics& row);

}  // namespace mlflow_detail

/// tracker::directory's files, and the run in MLflow's file store under <storage path>/mlruns, in
/// the experiment named after the run, or after the Tuner experiment of a trial (or experiment `ExperimentId` when it is >= 0; 0 is MLflow's
/// "Default"). Each fit() is one MLflow run: RUNNING with its params and tags when it starts, a
/// line per metric appended at each report (live curves), FINISHED, FAILED or KILLED (stopped by
/// a signal) with every reported metric, the evaluations' metrics and the run's files as
/// artifacts when it ends.
template <int ExperimentId = -1>
struct mlflow {
  static_assert(ExperimentId >= -1, "dtrain::tracker::mlflow<ExperimentId>: MLflow experiment ids are >= 0 (0 is "
                                    "\"Default\"), or -1 for an experiment per run name");
  using category = dtrain::category::tracker;
  static constexpr const char* name = "mlflow";
  static constexpr int experiment_id = ExperimentId;

  /// <storage path>/mlruns, shared by every run of the storage path: what to give
  /// `mlflow ui --backend-store-uri`.
  static std::filesystem::path store(const std::filesystem::path& run_dir) { return RunDirectory(run_dir).mlruns(); }
  /// The experiment's id: ExperimentId, or the stable id of the run's name.
  static std::string experiment(const tracking::RunRecord& run) {
    return ExperimentId >= 0 ? std::to_string(ExperimentId) : mlflow_detail::experiment_id(run.directory().experiment_name());
  }
  /// This run's directory in the store.
  static std::filesystem::path run_directory(const tracking::RunRecord& run) {
    return store(run.path) / experiment(run) /
           mlflow_detail::run_id(run.path, mlflow_detail::ms(run.outcome.value("start_time", 0.0)));
  }

  static void start(const tracking::RunRecord& run) {
    directory::start(run);
    namespace md = mlflow_detail;
    const auto root = store(run.path), experiment = root / mlflow::experiment(run), dir = run_directory(run);
    std::filesystem::create_directories(root / ".trash");
    const auto start_ms = md::ms(run.outcome.value("start_time", 0.0));
    md::write_once(experiment / "meta.yaml",
                     "artifact_location: " + md::quoted(md::file_uri(experiment)) + "\n" +
                         "creation_time: " + std::to_string(start_ms) + "\n" +
                         "experiment_id: " + md::quoted(mlflow::experiment(run)) + "\n" +
                         "last_update_time: " + std::to_string(start_ms) + "\n" +
                         "lifecycle_stage: active\n" +
                         "name: " + md::quoted(ExperimentId == 0 ? "Default" : run.directory().experiment_name()) + "\n");
    // MLflow 3's UI takes an experiment without this tag for a GenAI one (its runs listed as
    // "Evaluation runs"): say it is model training.
    md::write_once(experiment / "tags" / "mlflow.experimentKind", "custom_model_development");
    for (const char* sub : {"metrics", "params", "artifacts", "tags"}) std::filesystem::create_directories(dir / sub);
    write_meta(run, md::run_status::running, std::nullopt);
    std::vector<std::pair<std::string, std::string>> params;
    tracking::flatten(run.params, "", params);
    for (const auto& [k, v] : params) md::write_text(dir / "params" / md::key(k), v.substr(0, 6000));
    md::write_text(dir / "tags" / "mlflow.runName", run.name());
    md::write_text(dir / "tags" / "mlflow.user", md::user());
    md::write_text(dir / "tags" / "mlflow.source.name", md::program());
    md::write_text(dir / "tags" / "mlflow.source.type", "LOCAL");
    md::write_text(dir / "tags" / "dtrain.run_dir", std::filesystem::absolute(run.path).lexically_normal().string());
  }

  /// Rank 0's worker, after each report's row is in metrics.jsonl: appends a line to each of its
  /// metrics' files, so `mlflow ui` draws the curves while the run goes. Nothing happens for a run
  /// that start() did not create (a worker under an external launcher).
  static void report(const tracking::RunRecord& run, const Metrics& row) {
    const auto dir = run_directory(run);
    if (!std::filesystem::exists(dir / "meta.yaml")) return;
    std::map<std::string, std::string> lines;
    mlflow_detail::add_row(lines, row);
    for (const auto& [k, text] : lines) {
      std::ofstream out(dir / "metrics" / k, std::ios::app);
      out << text;
      out.flush();
      if (!out) throw Error((dir / "metrics" / k).string() + ": cannot append a metric line (disk full or read-only?)");
    }
  }

  /// The driver's heartbeat: outcome.json's (tracker::directory's).
  static void heartbeat(const tracking::RunRecord& run) { directory::heartbeat(run); }

  static void end(const tracking::RunRecord& run) {
    directory::end(run);
    namespace md = mlflow_detail;
    const auto dir = run_directory(run);
    // Metrics: one line per report, at that report's step and time (rewritten whole: the history
    // is the authority, and a report appended live may have been cut short).
    std::map<std::string, std::string> lines;
    for (const auto& row : run.history.rows()) md::add_row(lines, row);
    const double end_s = run.outcome.value("end_time", 0.0);
    const std::int64_t last_step = run.history.empty() || !run.history.rows().back().count("step")
                                       ? 0
                                       : static_cast<std::int64_t>(run.history.rows().back().at("step").number());
    for (const auto& e : run.evaluations) {
      const auto metrics = e.value("metrics", nlohmann::json::object());  // items() must not outlive it
      for (const auto& [k, v] : metrics.items())
        if (v.is_number())
          lines[md::key(e.value("name", std::string("evaluation")) + "/" + k)] +=
              std::to_string(md::ms(e.value("time", end_s))) + " " + md::value_text(v.template get<double>()) + " " +
              std::to_string(last_step) + "\n";
    }
    for (const auto& [k, text] : lines) md::write_text(dir / "metrics" / k, text);
    md::write_text(dir / "tags" / "dtrain.outcome", run.outcome.value("status", "unknown"));
    md::write_text(dir / "tags" / "dtrain.restarts", std::to_string(run.outcome.value("restarts", 0)));
    if (run.outcome.contains("error") && run.outcome.at("error").is_string())
      md::write_text(dir / "tags" / "mlflow.note.content", run.outcome.value("status", "failed") + ": " + run.outcome.at("error").get<std::string>());
    // Artifacts: the run's own files, as they are now.
    const auto files = run.directory();
    for (const auto& f : {files.report(), files.history_table(), files.step_history(), files.params(), files.outcome(),
                          files.checkpoint_index(), files.evaluations()}) {
      std::error_code ec;
      if (std::filesystem::exists(f, ec))
        std::filesystem::copy_file(f, dir / "artifacts" / f.filename(), std::filesystem::copy_options::overwrite_existing, ec);
    }
    const auto status = run.outcome.value("status", "");
    write_meta(run,
               status == "finished"  ? md::run_status::finished
               : status == "stopped" ? md::run_status::killed
                                     : md::run_status::failed,
               md::ms(end_s));
  }

 private:
  static void write_meta(const tracking::RunRecord& run, mlflow_detail::run_status status,
                         std::optional<std::int64_t> end_ms) {
    namespace md = mlflow_detail;
    const auto dir = run_directory(run);
    const auto id = dir.filename().string();
    // The keys file_store.py's _make_persisted_run_info_dict writes, in its order-free YAML.
    md::write_text(dir / "meta.yaml",
                   "artifact_uri: " + md::quoted(md::file_uri(dir / "artifacts")) + "\n" +
                       "end_time: " + (end_ms ? std::to_string(*end_ms) : std::string("null")) + "\n" +
                       "entry_point_name: ''\n" +
                       "experiment_id: " + md::quoted(experiment(run)) + "\n" +
                       "lifecycle_stage: active\n" +
                       "run_id: " + id + "\n" +
                       "run_name: " + md::quoted(run.name()) + "\n" +
                       "run_uuid: " + id + "\n" +
                       "source_name: ''\n" +
                       "source_type: 4\n" +
                       "source_version: ''\n" +
                       "start_time: " + std::to_string(md::ms(run.outcome.value("start_time", 0.0))) + "\n" +
                       "status: " + std::to_string(static_cast<int>(status)) + "\n" +
                       "tags: []\n" +
                       "user_id: " + md::quoted(md::user()) + "\n" +
                       "deleted_time: null\n");
  }
};

}  // namespace tracker

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/tracker/impl/mlflow.ipp>
#endif
