// SPDX-License-Identifier: Apache-2.0
#pragma once
// tune::Tuner: a hyperparameter search over a Trainer's loop (Ray Tune's Tuner).
//
//   dtrain::Trainer<Net, Data, dtrain::checkpointer::directory<>, dtrain::tracker::mlflow<>> trainer(
//       {.num_workers = 2}, {.storage_path = "runs", .name = "tagger_search"});
//   dtrain::tune::Tuner tuner(trainer, space, {.metric = "val_loss", .mode = dtrain::tune::Mode::min,
//                                              .num_samples = 8}, dtrain::tune::asha{.max_t = 10});
//   auto grid = tuner.fit(loop);              // loop(ctx) as for trainer.fit
//   auto& best = grid.best_result();          // its config, metrics, checkpoints
//
// Each trial is a run of the Trainer in storage_path/name/trial_NNNN, its config in the run's
// train_loop_config (tune::config<T>(ctx) reads it), started as a process of its own (this program
// again, which passes over the fit() calls before the Tuner's) that drives the trial's workers.
// The scheduler decides at each report, in the trial's rank 0 (ctx.stop_when): a stopped trial
// ends at that report, its checkpoints kept. A killed or stopped experiment continues when run
// again: finished and failed trials stay, the others resume from their checkpoints.

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <torch/cuda.h>

#include <dtrain/launch/environment.hpp>
#include <dtrain/launch/process.hpp>
#include <dtrain/launch/stop.hpp>
#include <dtrain/trainer.hpp>
#include <dtrain/tune/report.hpp>
#include <dtrain/tune/search.hpp>
#include <dtrain/tune/trial_process.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace tune {

/// The search's settings (Ray Tune's TuneConfig).
struct TuneConfig {
  /// The reported metric the scheduler and best_result() compare ("val_loss").
  std::string metric;
  /// Whether a lower or a higher metric is better: no default, a wrong guess would pick the worst.
  std::optional<Mode> mode = std::nullopt;
  /// Trials of a random search; passes over the grid of a space with grid() parameters.
  int num_samples = 1;
  /// The seed of every random choice of the search (each trial's seed is recorded in its trial.json).
  std::uint64_t seed = 0;
  /// Trials that run at once; 0: as many as the machine holds, each trial's workers given their
  /// own cores (num_workers * threads_per_worker of them), or their own GPUs on a GPU backend.
  int max_concurrent_trials = 0;
  /// The report's column the scheduler counts time in: "iteration" (report() calls, Ray's
  /// training_iteration), "epoch", "step" or "time_total_s".
  std::string time_attr = "iteration";

  void validate() const;
};

template <class TrainerT, class Sched = fifo, class Search = basic_search>
class Tuner {
  static_assert(requires(const TrainerT& t) {
    typename TrainerT::context;
    t.run_config();
    t.scaling_config();
  }, "dtrain::tune::Tuner<Trainer, ...>: the first argument must be a dtrain::Trainer<Model, Dataset, Policies...>");
  static_assert(Scheduler<Sched>, "dtrain::tune::Tuner: the scheduler must model dtrain::tune::Scheduler (a static "
                                  "name, describe() and on_result(histories, trial, point) returning tune::Decision), "
                                  "like tune::fifo, tune::asha or tune::median_stopping");
  static_assert(SearchAlgorithm<Search>, "dtrain::tune::Tuner: the search algorithm must model "
                                         "dtrain::tune::SearchAlgorithm (a static name, describe() and suggest(space, "
                                         "index, settings, so_far) returning std::optional<Metrics>), like tune::basic_search");

 public:
  Tuner(TrainerT trainer, Space space, TuneConfig config, Sched scheduler = {}, Search search = {})
      : trainer_(std::move(trainer)), space_(std::move(space)), config_(std::move(config)),
        scheduler_(std::move(scheduler)), search_(std::move(search)) {}

  /// The experiment's directory: the Trainer's RunConfig storage_path / name.
  std::filesystem::path path() const { return trainer_.run_config().path(); }

  /// The trials that run at once: TuneConfig::max_concurrent_trials, or what the machine holds.
  int max_concurrent() const {
    if (config_.max_concurrent_trials > 0) return config_.max_concurrent_trials;
    const auto& s = trainer_.scaling_config();
    if constexpr (TrainerT::uses_gpu)
      return std::max<int>(1, static_cast<int>(torch::cuda::device_count()) / s.num_workers);
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    return std::max(1, cores / (s.num_workers * s.threads_per_worker));
  }

  /// Runs the search: in this process the trials' driver, which returns every trial's result; in a
  /// trial's process (this program started again by the Tuner) runs that trial and ends the process.
  /// A signal (SIGINT, SIGTERM) stops the running trials, each recording its stop, then throws
  /// Stopped (FailureConfig::throw_on_failure) or returns the grid; run again to continue.
  template <class Loop>
  ResultGrid fit(Loop&& loop) {
    config_.validate();
    if constexpr (requires { scheduler_.validate(); }) scheduler_.validate();
    if (const auto trial = launch::detail::env(env_trial)) {
      if (std::filesystem::path(*trial).parent_path() != path()) return ResultGrid::from_path(path());  // an earlier Tuner
      run_trial(*trial, loop);
    }
    if (launch::detect_worker())
      throw ConfigError("tune::Tuner::fit runs under a launcher (torchrun, Slurm, Open MPI): a Tuner starts its "
                        "trials, and each trial its workers (ScalingConfig::num_workers), itself; run the program "
                        "directly, as one process");
    return drive();
  }

 private:
  static constexpr const char* env_trial = "DTRAIN_TUNE_TRIAL";

  nlohmann::json description() const {
    return {{"format", 1},
            {"space", space_.describe()},
            {"search", search_.describe()},
            {"scheduler", scheduler_.describe()},
            {"metric", config_.metric},
            {"mode", *config_.mode == Mode::max ? "max" : "min"},
            {"num_samples", config_.num_samples},
            {"seed", config_.seed},
            {"time_attr", config_.time_attr}};
  }

  // The experiment's tuner.json: written by the first run, the same search asked of every later one.
  void check_or_write_description(const ExperimentDirectory& dir) const {
    const auto want = description();
    const auto have = tracking::read_json(dir.tuner());
    if (!have.is_object()) return tracking::write_json(dir.tuner(), want);
    for (const auto& [key, value] : want.items())
      if (have.value(key, nlohmann::json()) != value)
        throw ConfigError("the Tuner experiment at " + dir.path().string() + " was run with " + key + " " +
                          have.value(key, nlohmann::json()).dump() + ", and this Tuner has " + value.dump() +
                          ": an experiment continues only with the search it started with. Give this search "
                          "another RunConfig::name, or set RunConfig::start = dtrain::Start::fresh to move the "
                          "earlier one aside");
  }

  // In a trial's process: its driver (output to the trial's output.log) or one of its workers.
  template <class Loop>
  [[noreturn]] void run_trial(const std::filesystem::path& dir, Loop& loop) {
    const auto spec = tracking::read_json(ExperimentDirectory::trial_spec(dir));
    if (!spec.is_object()) throw Error(ExperimentDirectory::trial_spec(dir).string() + " is missing: cannot run the trial");
    if (!launch::detect_worker()) redirect_output(ExperimentDirectory::trial_log(dir));
    RunConfig run = trainer_.run_config();
    run.storage_path = path();
    run.name = dir.filename().string();
    run.start = Start::resume;
    run.failure.throw_on_failure = false;  // the Tuner reads how it ended from the run directory
    for (const auto& [k, v] : spec.at("config").get<Metrics>()) run.train_loop_config[k] = v;
    const ExperimentDirectory exp(path());
    const std::string id = run.name;
    TrainerT trial(trainer_.scaling_config(), run);
    try {
      trial.fit([&](typename TrainerT::context& ctx) {
        Point at;
        Decision stop;
        ctx.stop_when([&](const Metrics& row) {
          stop = decide(exp, id, row, at);
          return stop.stop;
        });
        loop(ctx);
        // Recorded only where the stop cut the loop short: a trial whose loop ended at that
        // report anyway (its last epoch at ASHA's max_t) ran to its end.
        if (ctx.world_rank() == 0 && ctx.stopped_by_rule()) SchedulerLog::record_stop(exp, id, at.time, stop.why);
      });
    } catch (const std::exception& e) {
      std::fprintf(stderr, "dtrain tune: %s: %s\n", id.c_str(), e.what());
      std::fflush(nullptr);
      std::_Exit(1);
    }
    std::fflush(nullptr);
    std::_Exit(0);
  }

  // The scheduler's decision on one report of trial `id` (in its rank 0), at `p`.
  Decision decide(const ExperimentDirectory& exp, const std::string& id, const Metrics& row, Point& p) const {
    const auto t = row.find(config_.time_attr), m = row.find(config_.metric);
    if (t == row.end() || m == row.end() || !t->second.is_number() || !m->second.is_number()) return {};
    const double value = m->second.number();
    if (!std::isfinite(value)) return {};
    p = {t->second.number(), *config_.mode == Mode::max ? value : -value};
    auto d = SchedulerLog::record(exp, scheduler_, id, p);
    if (d.stop) std::fprintf(stderr, "dtrain tune: %s stops at %s %g: %s\n", id.c_str(), config_.time_attr.c_str(), p.time, d.why.c_str());
    return d;
  }

  ResultGrid drive();

  TrainerT trainer_;
  Space space_;
  TuneConfig config_;
  Sched scheduler_;
  Search search_;
};

}  // namespace tune

DTRAIN_NAMESPACE_END

#include <dtrain/tune/drive.hpp>

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/tune/impl/tuner.ipp>
#endif
