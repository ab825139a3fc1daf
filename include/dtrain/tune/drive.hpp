// SPDX-License-Identifier: Apache-2.0
#pragma once
// The Tuner's driver (tuner.hpp holds the class): trials created by the search and started up to
// the concurrency limit, each watched to its end, the experiment's summary rewritten as each ends;
// a signal stops the running trials; a re-run continues what is not finished.

#include <dtrain/tune/tuner.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace tune {

template <class TrainerT, class Sched, class Search>
ResultGrid Tuner<TrainerT, Sched, Search>::drive() {
  const auto& run = trainer_.run_config();
  run.validate();
  trainer_.scaling_config().validate();
  launch::StopSignals stop_signals;
  deny_world_write();
  const ExperimentDirectory exp(path());
  if (run.start == Start::fresh)
    if (const auto old = RunDirectory(path()).move_aside())
      std::fprintf(stderr, "dtrain tune: a fresh start of %s: the earlier experiment was moved to %s\n",
                   path().c_str(), old->c_str());
  RunDirectory(path()).create();
  const FileLock running(exp.tuner_lock(), /*wait=*/false);
  if (!running.held())
    throw ConfigError("another Tuner is running the experiment at " + path().string() +
                      " now; wait for it to end, or give this one another RunConfig::name");
  check_or_write_description(exp);
  const auto tuner = description();
  const bool say = run.progress.verbosity != Verbosity::quiet;

  // What earlier runs of the experiment created: finished and failed trials stay, the rest resume.
  auto so_far = ResultGrid::from_path(path(), /*with_checkpoints=*/false).trials();
  std::vector<std::filesystem::path> to_resume;
  std::size_t next_index = 0;
  for (const auto& t : so_far) {
    next_index = std::max(next_index, t.index + 1);
    if (!t.done()) to_resume.push_back(t.path());
  }
  if (say && !so_far.empty())
    std::fprintf(stderr, "dtrain tune: %s continues: %zu trials done, %zu to resume\n", path().c_str(),
                 so_far.size() - to_resume.size(), to_resume.size());

  const int limit = max_concurrent();
  int gpus_per_trial = 0;
  if constexpr (TrainerT::uses_gpu) gpus_per_trial = trainer_.scaling_config().num_workers;
  TrialProcesses trials(limit, gpus_per_trial, env_trial);
  if constexpr (TrainerT::uses_gpu) trials.set_gpu_count(static_cast<int>(torch::cuda::device_count()));
  const SearchSettings settings{config_.num_samples, config_.seed};
  auto summarise = [&] {
    const auto grid = ResultGrid::from_path(path(), /*with_checkpoints=*/false);
    write_summary(grid, config_.time_attr, tuner);
    so_far = grid.trials();
  };

  bool exhausted = false, stopping = false;
  int signals_seen = 0;
  for (;;) {
    if (const int received = launch::stop_signals_received(); received > signals_seen) {
      signals_seen = received;
      stopping = true;
      // Each trial stops its workers and records the stop (a second signal: killed at once).
      trials.signal_all(received > 1 ? SIGKILL : SIGTERM);
      std::fprintf(stderr, "dtrain tune: stopping the %d running trials%s\n", trials.running(),
                   received > 1 ? " at once" : " (a second signal kills them)");
    }
    while (!stopping && trials.running() < limit) {
      std::filesystem::path dir;
      if (!to_resume.empty()) {
        dir = to_resume.front();
        to_resume.erase(to_resume.begin());
      } else if (!exhausted) {
        auto config = search_.suggest(space_, next_index, settings, so_far);
        if (!config) {
          exhausted = true;
          break;
        }
        const auto id = ExperimentDirectory::trial_id(next_index);
        dir = exp.trial(id);
        std::filesystem::create_directories(dir);
        tracking::write_json(ExperimentDirectory::trial_spec(dir),
                             {{"format", 1}, {"id", id}, {"index", next_index},
                              {"seed", trial_seed(config_.seed, next_index)}, {"config", *config}});
        ++next_index;
      } else {
        break;
      }
      trials.start(dir);
      if (say) {
        const auto spec = tracking::read_json(ExperimentDirectory::trial_spec(dir));
        std::fprintf(stderr, "dtrain tune: %s started: %s\n", dir.filename().c_str(),
                     metrics_line(spec.at("config").get<Metrics>()).c_str());
      }
    }
    if (auto ended = trials.poll()) {
      const auto& [dir, how] = *ended;
      const auto outcome = tracking::read_json(RunDirectory(dir).outcome(), nlohmann::json::object());
      const auto status = outcome.value("status", std::string("pending"));
      // A process that ended without fit() recording an end failed on its own (not when the Tuner
      // is stopping: a killed trial resumes).
      if (!stopping && (status == "pending" || status == "running") ) {
        auto spec = tracking::read_json(ExperimentDirectory::trial_spec(dir));
        spec["process_error"] = "the trial's process " + how.describe() + " before its run recorded an end; see " +
                                ExperimentDirectory::trial_log(dir).string();
        tracking::write_json(ExperimentDirectory::trial_spec(dir), spec);
      }
      summarise();
      if (say) {
        // Named through an init-capture: Clang before 16 cannot capture a structured binding.
        const auto t = std::find_if(so_far.begin(), so_far.end(),
                                    [&ended_dir = dir](const TrialResult& r) { return r.path() == ended_dir; });
        if (t != so_far.end()) {
          const double v = t->score(config_.metric, *config_.mode);
          std::fprintf(stderr, "dtrain tune: %s %s%s: %s %s%s\n", t->id.c_str(), t->status.c_str(),
                       t->stopped_early ? " (stopped early by the scheduler)" : "", config_.metric.c_str(),
                       std::isnan(v) ? "not reported" : tracking::html::number(v).c_str(),
                       t->error ? (" (" + *t->error + ")").c_str() : "");
        }
      }
      continue;
    }
    if (trials.running() == 0 && (stopping || (exhausted && to_resume.empty()))) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }

  auto grid = ResultGrid::from_path(path(), /*with_checkpoints=*/true);
  write_summary(grid, config_.time_attr, tuner);
  if (stopping) {
    const std::string msg = "the Tuner experiment at " + path().string() +
                            " was stopped by a signal; run it again (the same storage path and name) to continue: "
                            "finished trials stay, the others resume from their checkpoints";
    std::fprintf(stderr, "dtrain tune: %s\n", msg.c_str());
    if (run.failure.throw_on_failure) throw Stopped(msg);
  }
  return grid;
}

}  // namespace tune

DTRAIN_NAMESPACE_END
