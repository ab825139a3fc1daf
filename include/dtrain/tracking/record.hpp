// SPDX-License-Identifier: Apache-2.0
#pragma once
// RunRecord, everything a tracker writes from, and the tracking files' JSON: params, checkpoint
// index, evaluations (run_directory.hpp lists the run directory's files).
//
// docs/run-directory.md describes each file's fields for readers in other languages.

#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <typeinfo>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <dtrain/checkpointer/checkpoint.hpp>
#include <dtrain/checkpointer/retention.hpp>
#include <dtrain/config.hpp>
#include <dtrain/detail/type_name.hpp>
#include <dtrain/error.hpp>
#include <dtrain/metrics.hpp>
#include <dtrain/result.hpp>
#include <dtrain/run_directory.hpp>
#include <dtrain/version.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace tracking {

/// The format version written into params.json, outcome.json, checkpoints.json and
/// evaluations.json ("format": 1); a reader checks it before reading further.
inline constexpr int format_version = 1;

/// Writes `text` to `path` through a temporary file and a rename, so a reader never sees half a
/// file (a report being rewritten while someone has it open, say). The temporary is written,
/// flushed, checked and synced before the rename: a failed write (a full disk) throws and leaves
/// the earlier file as it was.
void write_atomically(const std::filesystem::path& path, const std::string& text);

/// write_atomically of `j`'s text, indented by 2.
void write_json(const std::filesystem::path& path, const nlohmann::json& j);

using dtrain::detail::read_json;

/// An evaluation as evaluations.json holds it. `confusion[t][p]`: samples of true class t
/// predicted as p.
nlohmann::json evaluation_json(const std::string& name, const Metrics& metrics,
                               const std::vector<std::string>& class_names,
                               const std::vector<std::vector<std::int64_t>>& confusion,
                               const std::string& checkpoint, double time_unix);

/// Adds `evaluation` to run_dir/evaluations.json, replacing an earlier one of the same name.
void record_evaluation(const RunDirectory& run_dir, const nlohmann::json& evaluation);

/// steps.jsonl, read for a page: a file that cannot be read (cut short by a full disk, say) gives
/// a warning and no step curves, never a run that cannot end.
MetricsHistory read_step_history(const RunDirectory& dir);

/// A run as a tracker sees it: the run directory's files, read back into memory. The driver
/// builds one when the run starts (params, outcome "running") and again when it ends.
struct RunRecord {
  std::filesystem::path path;
  nlohmann::json params = nlohmann::json::object();
  MetricsHistory history;
  MetricsHistory step_history;  // steps.jsonl (tracking/step_history.hpp)
  nlohmann::json checkpoints = nlohmann::json::object();
  nlohmann::json evaluations = nlohmann::json::array();
  nlohmann::json outcome = nlohmann::json::object();

  /// The run's name (the run directory's last component).
  std::string name() const { return path.filename().string(); }
  RunDirectory directory() const { return RunDirectory(path); }

  /// The run as the driver started it (outcome.json's start, no history): what a Tracker's
  /// report hook gets in rank 0's worker. Without outcome.json (a worker under an external
  /// launcher, no driver of ours) the outcome is empty.
  static RunRecord read_started(const std::filesystem::path& run_dir);

  /// Reads a run directory back (for a report rendered again, or a test). Missing files give
  /// empty parts; a file that is not JSON throws Error naming it.
  static RunRecord read(const std::filesystem::path& run_dir);
};

/// `j` flattened to "a.b.c" -> text pairs (MLflow's params are flat strings). Arrays are kept as
/// their JSON text; strings without their quotes.
void flatten(const nlohmann::json& j, const std::string& prefix, std::vector<std::pair<std::string, std::string>>& out);

/// A Trainer's resolved policies as params.json records them: each one's `name` (its own, or its
/// type's when it has none) and its full C++ type (the policies' template numbers show in it).
struct PolicyNames {
  struct Policy {
    std::string name, type;
  };
  Policy backend, sampler, checkpointer, strategy, precision, tracker;
  bool uses_gpu = false;  // the backend trains on GPUs (params.json's scaling.use_gpu)
};

template <class P>
PolicyNames::Policy policy_name() {
  auto type = dtrain::detail::type_name<P>();
  if constexpr (requires { P::name; }) return {std::string(P::name), std::move(type)};
  else return {type, type};
}

template <class Policies>
PolicyNames policy_names() {
  return {policy_name<typename Policies::backend>(),      policy_name<typename Policies::sampler>(),
          policy_name<typename Policies::checkpointer>(), policy_name<typename Policies::strategy>(),
          policy_name<typename Policies::precision>(),    policy_name<typename Policies::tracker>(),
          Policies::backend::uses_cuda};
}

/// params.json: the Trainer's resolved policies, its configs and the train loop's own config.
nlohmann::json params_json(const PolicyNames& policies, const ScalingConfig& scaling, const RunConfig& run);

template <class Policies>
nlohmann::json params_json(const ScalingConfig& scaling, const RunConfig& run) {
  return params_json(policy_names<Policies>(), scaling, run);
}

/// checkpoints.json: the valid checkpoints (checkpointer::all_valid, newest first), each with its
/// score by `config`, and which one is the latest and which the best.
nlohmann::json checkpoint_index(const std::vector<checkpointer::Checkpoint>& valid, const CheckpointConfig& config);

}  // namespace tracking

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/tracking/impl/record.ipp>
#endif
