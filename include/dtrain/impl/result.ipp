// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of result.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/result.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace detail {

DTRAIN_INLINE nlohmann::json read_json(const std::filesystem::path& path, nlohmann::json fallback) {
  std::ifstream in(path);
  if (!in) return fallback;
  try {
    return nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    throw Error(path.string() + ": not valid JSON (" + e.what() + "); was it cut short?");
  }
}
}  // namespace detail

DTRAIN_INLINE std::vector<std::string> MetricsHistory::columns() const {
  std::set<std::string> names;
  for (const auto& r : rows_)
    for (const auto& [k, v] : r) names.insert(k);
  return {names.begin(), names.end()};
}

DTRAIN_INLINE std::vector<double> MetricsHistory::column(std::string_view name) const {
  std::vector<double> out;
  out.reserve(rows_.size());
  for (const auto& r : rows_) {
    auto it = r.find(name);
    out.push_back(it == r.end() || !it->second.is_number() ? std::numeric_limits<double>::quiet_NaN()
                                                          : it->second.number());
  }
  return out;
}

DTRAIN_INLINE MetricsHistory MetricsHistory::read_jsonl(const std::filesystem::path& path) {
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

DTRAIN_INLINE void MetricsHistory::truncate_jsonl(const std::filesystem::path& path, std::string_view column, std::int64_t last) {
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

DTRAIN_INLINE void MetricsHistory::append_jsonl(const std::filesystem::path& path, const Metrics& row) {
  std::ofstream out(path, std::ios::app);
  out << nlohmann::json(row).dump() << '\n';
  if (!out) throw Error(path.string() + ": cannot append a metrics row (disk full or read-only?)");
}

DTRAIN_INLINE void MetricsHistory::write_csv(const std::filesystem::path& path) const {
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

DTRAIN_INLINE std::vector<Evaluation> Evaluation::from_json(const nlohmann::json& list, const std::string& source) {
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

DTRAIN_INLINE std::vector<GroupStart> GroupStart::list_from_json(const nlohmann::json& list) {
  std::vector<GroupStart> out;
  if (!list.is_array()) return out;
  for (const auto& g : list)
    out.push_back({g.value("attempt", 0), g.value("world_size", 0), g.value("step", std::int64_t{0}),
                   g.value("reason", std::string())});
  return out;
}

DTRAIN_INLINE RunFiles RunFiles::read(const std::filesystem::path& run_dir, bool with_checkpoints) {
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

DTRAIN_INLINE void Result::set_checkpoints(const std::vector<Checkpoint>& valid, const CheckpointConfig& config) {
  latest_ = valid.empty() ? std::nullopt : std::optional<Checkpoint>(valid.front());
  best_ = checkpointer::best_of(valid, config);
  ranked_ = valid;
  const bool higher = config.score_order == ScoreOrder::max;
  std::stable_sort(ranked_.begin(), ranked_.end(), [&](const Checkpoint& a, const Checkpoint& b) {
    return checkpointer::scores_better(a.metrics(), a.iteration(), b.metrics(), b.iteration(),
                                       config.score_attribute, higher);
  });
}

DTRAIN_INLINE Result Result::from_path(const std::filesystem::path& run_dir, bool with_checkpoints) {
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

DTRAIN_INLINE Result Result::assemble(const RunFiles& files, const std::filesystem::path& run_dir, const CheckpointConfig& config,
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
DTRAIN_NAMESPACE_END
