// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of record.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/tracking/record.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace tracking {

DTRAIN_INLINE void write_atomically(const std::filesystem::path& path, const std::string& text) {
  const auto tmp = path.string() + ".tmp";
  auto fail = [&](const std::string& why) {
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    throw Error(tmp + ": cannot be written (" + why + "); " + path.string() +
                " was left as it was. Check that the run directory is writable and its disk not full");
  };
  std::FILE* out = std::fopen(tmp.c_str(), "wb");
  if (out == nullptr) fail(std::strerror(errno));
  const bool written = std::fwrite(text.data(), 1, text.size(), out) == text.size() && std::fflush(out) == 0 &&
                       ::fsync(::fileno(out)) == 0;
  const int write_errno = errno;
  if (std::fclose(out) != 0 || !written) fail(std::strerror(written ? errno : write_errno));
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) fail("it cannot be renamed into place: " + ec.message());
}

DTRAIN_INLINE void write_json(const std::filesystem::path& path, const nlohmann::json& j) {
  write_atomically(path, j.dump(2) + "\n");
}

DTRAIN_INLINE nlohmann::json evaluation_json(const std::string& name, const Metrics& metrics,
                                             const std::vector<std::string>& class_names,
                                             const std::vector<std::vector<std::int64_t>>& confusion,
                                             const std::string& checkpoint, double time_unix) {
  return {{"name", name}, {"metrics", metrics}, {"class_names", class_names},
          {"confusion_matrix", confusion}, {"checkpoint", checkpoint}, {"time", time_unix}};
}

DTRAIN_INLINE void record_evaluation(const RunDirectory& run_dir, const nlohmann::json& evaluation) {
  auto doc = read_json(run_dir.evaluations(), {{"format", format_version}, {"evaluations", nlohmann::json::array()}});
  auto& list = doc["evaluations"];
  for (auto it = list.begin(); it != list.end(); ++it)
    if ((*it).value("name", "") == evaluation.at("name").get<std::string>()) {
      list.erase(it);
      break;
    }
  list.push_back(evaluation);
  write_json(run_dir.evaluations(), doc);
}

DTRAIN_INLINE MetricsHistory read_step_history(const RunDirectory& dir) {
  try {
    return MetricsHistory::read_jsonl(dir.step_history());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dtrain: warning: %s; report.html shows no curves from it\n", e.what());
    return {};
  }
}

DTRAIN_INLINE RunRecord RunRecord::read_started(const std::filesystem::path& run_dir) {
  RunRecord r;
  r.path = run_dir;
  r.outcome = read_json(RunDirectory(run_dir).outcome(), nlohmann::json::object());
  return r;
}

DTRAIN_INLINE RunRecord RunRecord::read(const std::filesystem::path& run_dir) {
  RunRecord r;
  r.path = run_dir;
  const RunDirectory dir(run_dir);
  r.params = read_json(dir.params(), nlohmann::json::object());
  r.history = MetricsHistory::read_jsonl(dir.history());
  r.step_history = read_step_history(dir);
  r.checkpoints = read_json(dir.checkpoint_index(), nlohmann::json::object());
  r.evaluations = read_json(dir.evaluations(), nlohmann::json::object()).value("evaluations", nlohmann::json::array());
  r.outcome = read_json(dir.outcome(), nlohmann::json::object());
  return r;
}

DTRAIN_INLINE void flatten(const nlohmann::json& j, const std::string& prefix, std::vector<std::pair<std::string, std::string>>& out) {
  if (j.is_object()) {
    for (const auto& [k, v] : j.items()) flatten(v, prefix.empty() ? k : prefix + "." + k, out);
    return;
  }
  if (j.is_string()) out.emplace_back(prefix, j.get<std::string>());
  else if (j.is_null()) out.emplace_back(prefix, "None");
  else out.emplace_back(prefix, j.dump());
}

DTRAIN_INLINE nlohmann::json params_json(const PolicyNames& policies, const ScalingConfig& scaling,
                                         const RunConfig& run) {
  static constexpr const char* verbosity[] = {"quiet", "normal", "verbose"};
  auto policy = [](const PolicyNames::Policy& p) { return nlohmann::json{{"type", p.type}, {"name", p.name}}; };
  return {
      {"format", format_version},
      {"dtrain_version", std::to_string(DTRAIN_VERSION_MAJOR) + "." + std::to_string(DTRAIN_VERSION_MINOR) + "." +
                             std::to_string(DTRAIN_VERSION_PATCH)},
      {"policies",
       {{"backend", policy(policies.backend)},
        {"sampler", policy(policies.sampler)},
        {"checkpointer", policy(policies.checkpointer)},
        {"strategy", policy(policies.strategy)},
        {"precision", policy(policies.precision)},
        {"tracker", policy(policies.tracker)}}},
      {"scaling", {{"num_workers", scaling.num_workers}, {"threads_per_worker", scaling.threads_per_worker},
                   {"min_workers", scaling.minimum_workers()}, {"use_gpu", policies.uses_gpu}}},
      {"run",
       {{"storage_path", run.storage_path.string()},
        {"name", run.name},
        {"rendezvous_timeout_ms", run.rendezvous_timeout.count()},
        {"collective_timeout_ms", run.collective_timeout.count()},
        {"resume_from", run.resume_from ? nlohmann::json(run.resume_from->string()) : nlohmann::json(nullptr)},
        {"start", run.start == Start::fresh ? "fresh" : "resume"},
        {"seed", run.seed ? nlohmann::json(*run.seed) : nlohmann::json(nullptr)},
        {"progress",
         {{"verbosity", verbosity[static_cast<int>(run.progress.verbosity)]},
          {"interval_ms", run.progress.interval.count()},
          {"record_every", run.progress.record_every}}}}},
      {"checkpoint",
       {{"num_to_keep", run.checkpoint.num_to_keep},
        {"score_attribute", run.checkpoint.score_attribute},
        {"score_order", run.checkpoint.score_order == ScoreOrder::max ? "max" : "min"}}},
      {"failure",
       {{"max_failures", run.failure.max_failures},
        {"max_repeated_failures", run.failure.max_repeated_failures},
        {"throw_on_failure", run.failure.throw_on_failure},
        {"stop_grace_ms", run.failure.stop_grace.count()},
        {"stop_poll_ms", run.failure.stop_poll.count()},
        {"restart_backoff_ms", run.failure.restart_backoff.count()},
        {"restart_backoff_max_ms", run.failure.restart_backoff_max.count()},
        {"heartbeat_timeout_ms", run.failure.heartbeat_timeout.count()},
        {"progress_timeout_ms", run.failure.progress_timeout.count()}}},
      {"train_loop_config", run.train_loop_config},
  };
}

DTRAIN_INLINE nlohmann::json checkpoint_index(const std::vector<checkpointer::Checkpoint>& valid, const CheckpointConfig& config) {
  nlohmann::json list = nlohmann::json::array();
  const auto best = checkpointer::best_of(valid, config);
  const std::string latest_name = valid.empty() ? "" : valid.front().path().filename().string();
  for (const auto& c : valid) {
    const auto name = c.path().filename().string();
    nlohmann::json e = {{"directory", name}, {"path", std::filesystem::absolute(c.path()).string()},
                        {"iteration", c.iteration()}, {"epoch", c.epoch()}, {"step", c.steps()},
                        {"metrics", c.metrics()}, {"latest", name == latest_name},
                        {"best", best && best->iteration() == c.iteration()}};
    if (!config.score_attribute.empty()) {
      auto it = c.metrics().find(config.score_attribute);
      e["score"] = it == c.metrics().end() ? nlohmann::json(nullptr) : nlohmann::json(it->second);
    }
    list.push_back(std::move(e));
  }
  return {{"format", format_version},
          {"score_attribute", config.score_attribute},
          {"score_order", config.score_order == ScoreOrder::max ? "max" : "min"},
          {"num_to_keep", config.num_to_keep},
          {"latest", latest_name.empty() ? nlohmann::json(nullptr) : nlohmann::json(latest_name)},
          {"best", best ? nlohmann::json(best->path().filename().string()) : nlohmann::json(nullptr)},
          {"checkpoints", list}};
}
}  // namespace tracking
DTRAIN_NAMESPACE_END
