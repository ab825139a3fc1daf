// SPDX-License-Identifier: Apache-2.0
#pragma once
// A Tuner experiment's directory, storage_path/name/ of the Trainer's RunConfig:
//
//   tuner.json        the search: space, search algorithm, scheduler, metric, mode, samples, seed
//   trial_NNNN/       one dtrain run directory per trial (params.json, metrics.jsonl, checkpoints,
//                     report.html...), with trial.json (its index, seed and config) and output.log
//                     (the trial's driver and workers' stdout and stderr)
//   scheduler.json    every trial's results as the scheduler saw them, and its stops
//   trials.csv        one row per trial: status, config, last and best metric
//   results.json      the same, for programs; rewritten as each trial ends
//   report.html       the experiment's report: every trial's curve and the table
//   mlruns/           under tracker::mlflow<>: one MLflow experiment, a run per trial
//
// docs/tune.md describes each file.

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iomanip>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include <dtrain/error.hpp>
#include <dtrain/metrics.hpp>
#include <dtrain/tracking/record.hpp>
#include <dtrain/tune/scheduler.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace tune {

/// The paths of an experiment directory.
class ExperimentDirectory {
 public:
  explicit ExperimentDirectory(std::filesystem::path root) : root_(std::move(root)) {}
  const std::filesystem::path& path() const { return root_; }
  std::filesystem::path tuner() const { return root_ / "tuner.json"; }
  std::filesystem::path scheduler_log() const { return root_ / "scheduler.json"; }
  std::filesystem::path scheduler_lock() const { return root_ / ".scheduler.lock"; }
  std::filesystem::path tuner_lock() const { return root_ / ".tuner.lock"; }
  std::filesystem::path table() const { return root_ / "trials.csv"; }
  std::filesystem::path results() const { return root_ / "results.json"; }
  std::filesystem::path report() const { return root_ / "report.html"; }
  /// Trial `index`'s id and run directory name: trial_0000, trial_0001, ...
  static std::string trial_id(std::size_t index);
  std::filesystem::path trial(const std::string& id) const { return root_ / id; }
  static std::filesystem::path trial_spec(const std::filesystem::path& trial_dir) { return trial_dir / "trial.json"; }
  static std::filesystem::path trial_log(const std::filesystem::path& trial_dir) { return trial_dir / "output.log"; }

 private:
  std::filesystem::path root_;
};

/// An exclusive flock on `path` (created if need be), released when this ends or the process dies.
class FileLock {
 public:
  /// Waits for the lock when `wait`; else `held()` says whether it was free.
  FileLock(const std::filesystem::path& path, bool wait);
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  ~FileLock() {
    if (fd_ >= 0) ::close(fd_);
  }
  bool held() const { return held_; }

 private:
  int fd_ = -1;
  bool held_ = false;
};

/// A trial's results as the scheduler saw them, and the experiment's stops (scheduler.json):
/// shared by the trials' rank-0 workers, each process under the lock.
struct SchedulerLog {
  Histories results;
  std::map<std::string, nlohmann::json, std::less<>> stops;  // trial -> {"time", "why"}

  static SchedulerLog read(const ExperimentDirectory& dir);

  void write(const ExperimentDirectory& dir) const;

  /// Asks `scheduler` about `trial`'s new result and records the result, under the experiment's
  /// lock: the trials of an experiment each see the others' results in the order they were
  /// recorded. A result at a time the trial reported before (a resumed trial reports again from its
  /// checkpoint) replaces it.
  template <Scheduler S>
  static Decision record(const ExperimentDirectory& dir, const S& scheduler, const std::string& trial, Point p) {
    FileLock lock(dir.scheduler_lock(), /*wait=*/true);
    auto log = read(dir);
    auto& own = log.results[trial];
    std::erase_if(own, [&](const Point& q) { return q.time >= p.time; });
    Decision d;
    {
      const Histories& before = log.results;  // own holds the earlier results only
      d = scheduler.on_result(before, trial, p);
    }
    own.push_back(p);
    log.write(dir);
    return d;
  }

  /// Records that the scheduler's stop at `time` cut `trial`'s loop short (ctx.stopped_by_rule()).
  static void record_stop(const ExperimentDirectory& dir, const std::string& trial, double time, const std::string& why);
};

}  // namespace tune

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/tune/impl/experiment.ipp>
#endif
