// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of driver.hpp: Trainer::fit()'s driver and a worker's life around its train loop.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <iostream>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <dtrain/checkpointer/checkpoint.hpp>
#include <dtrain/checkpointer/selection.hpp>
#include <dtrain/error.hpp>
#include <dtrain/launch/elastic.hpp>
#include <dtrain/launch/fresh_start.hpp>
#include <dtrain/launch/heartbeat.hpp>
#include <dtrain/launch/process.hpp>
#include <dtrain/launch/rendezvous.hpp>
#include <dtrain/launch/restarts.hpp>
#include <dtrain/launch/stop.hpp>
#include <dtrain/launch/worker_threads.hpp>
#include <dtrain/memory.hpp>
#include <dtrain/run_directory.hpp>
#include <dtrain/trainer/driver.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace detail {

// One fit(): the driver's state across its worker groups, or a worker's run of the loop.
class Driver {
 public:
  Driver(const ScalingConfig& scaling, const RunConfig& run, const TrainerPolicies& policies, const TrainLoop& train)
      : scaling_(scaling), run_(run), policies_(policies), train_(train) {}

  Result fit() {
    scaling_.validate();
    run_.validate();
    launch::check_elastic(scaling_, policies_.persists, policies_.shards_optimizer, policies_.reshards_optimizer);
    if (!policies_.persists && run_.resume_from)
      throw ConfigError("RunConfig::resume_from is set but the Trainer's Checkpointer is checkpointer::none, "
                        "which neither writes nor reads checkpoints; add dtrain::checkpointer::directory<> "
                        "to the Trainer's policies");
    deny_world_write();  // nothing of the run world-writable, whatever the umask (docs/security.md)
    // A worker of a later fit() of this program (a training, then batch inference), started anew,
    // or a Tuner's trial, passes over this one: its run ended before the driver went on.
    if (const auto own = launch::detail::env(launch::env_run_path); own && *own != run_.path().string())
      return finished_earlier(*own);
    if (auto who = launch::detect_worker()) run_worker(*who);
    return drive();
  }

 private:
  Result finished_earlier(const std::string& own) const;
  [[noreturn]] void run_worker(const launch::WorkerIdentity& who);
  tracking::RunTracking start_tracking(const launch::WorkerIdentity& who, c10d::Store& store) const;
  void depart(c10d::Store& store, const launch::WorkerIdentity& who) const;
  Result drive();
  Result stop_run(tracking::RunTracking& record, int restarts) const;
  using Variables = std::function<std::vector<std::pair<std::string, std::string>>(int rank, int attempt)>;
  std::optional<std::string> run_group(c10d::Store& store, int n, int attempt, bool fork_workers,
                                       const Variables& variables, const std::function<void()>& beat);
  std::optional<std::pair<std::int64_t, std::int64_t>> resume_point(c10d::Store& store) const;
  std::int64_t resume_step(c10d::Store& store) const {
    const auto point = resume_point(store);
    return point ? point->second : 0;
  }
  void remove_unfinished_writes() const;
  tracking::RunTracking tracking(const ScalingConfig& scaling) const {
    return tracking::RunTracking(tracking::params_json(policies_.names, scaling, run_), run_, policies_.persists,
                                 policies_.tracker);
  }

  ScalingConfig scaling_;
  RunConfig run_;
  TrainerPolicies policies_;
  const TrainLoop& train_;
  int failed_rank_ = -1;      // the rank whose end failed the last group
  bool stop_killed_ = false;  // the last group was killed while stopping (grace over, second signal)
};

DTRAIN_INLINE Result Driver::finished_earlier(const std::string& own) const {
  try {
    return Result::from_path(run_.path());
  } catch (const std::exception& e) {
    throw ConfigError("this process (a worker, or a Tuner's trial) was started for the run at " + own +
                      ", and the program called fit() of " + run_.path().string() +
                      " first, which the driver did not run (" + e.what() +
                      "); the driver and its workers must call fit() in the same order");
  }
}

DTRAIN_INLINE void Driver::run_worker(const launch::WorkerIdentity& who) {
  int status = 0;
  c10::intrusive_ptr<c10d::Store> store;
  // Under torchrun, Slurm or Open MPI no driver of ours records the run: rank 0 does, the same way.
  std::optional<tracking::RunTracking> tracked;
  try {
    launch::install_worker_signal_handlers();
    launch::set_worker_threads(scaling_.threads_per_worker);
    if (!who.store_on_driver && who.local_rank == 0) launch::warn_if_generic_blas_kernel();  // once a host
    retain_freed_memory_by_default();
    store = launch::connect_store(who, run_.rendezvous_timeout);
    launch::rendezvous(*store, who, run_.rendezvous_timeout);
    if (!who.store_on_driver && run_.start == Start::fresh)  // no driver of ours moved the old run aside
      launch::start_fresh_under_launcher(*store, who, run_.path(), run_.rendezvous_timeout);
    if (!who.store_on_driver && who.rank == 0) tracked.emplace(start_tracking(who, *store));
    const bool stopped = train_(who, store);
    if (tracked)
      tracked->end(stopped ? "stopped" : "finished", who.attempt,
                   stopped ? launch::stop_message("the workers", run_.path(), policies_.persists) : "");
    depart(*store, who);
  } catch (const launch::Regroup&) {  // an elastic group's checkpoint to grow back from is complete
    depart(*store, who);
  } catch (const RankTaken& e) {  // not this group's failure: the rank's holder goes on
    std::fprintf(stderr, "dtrain: %s\n", e.what());
    std::_Exit(1);
  } catch (const std::exception& e) {
    status = 1;
    const std::string what = e.what();
    std::fprintf(stderr, "dtrain: rank %d failed: %s\n", who.rank, what.c_str());
    if (tracked) {
      try {
        tracked->end("failed", who.attempt, "training failed: rank " + std::to_string(who.rank) + ": " + what, who.rank);
      } catch (const std::exception& t) {  // the training error matters more
        std::fprintf(stderr, "dtrain: warning: the tracker could not record the failure: %s\n", t.what());
      }
    }
    if (store) {
      try {
        store->set(launch::key(who.attempt, "error/" + std::to_string(who.rank)),
                   launch::to_bytes(std::to_string(unix_now()) + " " + what));
        store->add(launch::key(who.attempt, "errors"), 1);
        // A configuration that cannot work fails the same way after any restart.
        if (dynamic_cast<const ConfigError*>(&e))
          store->set(launch::key(who.attempt, "config_error"), launch::to_bytes("1"));
      } catch (...) {  // the store went away with the driver: stderr has it
      }
    }
  }
  std::cout.flush();
  std::fflush(nullptr);
  // Skip static destructors: Gloo's and the store's threads may still be blocked on peers.
  std::_Exit(status);
}

// Rank 0 under a launcher: the run recorded as the driver records it (params.json, outcome.json
// "running"); a group the launcher restarted continues the first group's record.
DTRAIN_INLINE tracking::RunTracking Driver::start_tracking(const launch::WorkerIdentity& who, c10d::Store& store) const {
  RunDirectory(run_.path()).create();
  remove_unfinished_writes();  // before anything is written: a full disk may be full of them
  ScalingConfig launched = scaling_;
  launched.num_workers = who.world_size;  // the launcher's count, not the driver's setting
  launched.min_workers.reset();           // the launcher's range (torchrun --nnodes MIN:MAX) is its own
  auto t = tracking(launched);
  const auto step = resume_step(store);
  if (who.attempt > 0) t.continue_run(who.attempt, step);
  // A group the launcher restarted with another count (torchrun --nnodes MIN:MAX) shrank or grew.
  const auto& groups = t.outcome()["groups"];
  const int before = groups.empty() ? who.world_size : groups.back().value("world_size", who.world_size);
  const char* why = who.attempt == 0         ? "start"
                    : who.world_size < before ? "shrink"
                    : who.world_size > before ? "grow"
                                              : "restart";
  t.group_started(who.attempt, who.world_size, step, why);
  t.start();
  return t;
}

// Under an external launcher rank 0 hosts the store: it leaves last, once every rank departed or
// failed (a failed rank records its error first, then leaves), or after the heartbeat timeout (the
// collective timeout without heartbeats) for a rank that did neither (killed), saying so.
DTRAIN_INLINE void Driver::depart(c10d::Store& store, const launch::WorkerIdentity& who) const {
  store.add(launch::key(who.attempt, "departed"), 1);
  if (who.store_on_driver || who.store_on_agent || who.rank != 0) return;
  const auto patience = run_.failure.heartbeat_timeout.count() > 0 ? run_.failure.heartbeat_timeout
                                                                   : run_.collective_timeout;
  const auto deadline = std::chrono::steady_clock::now() + patience;
  for (;;) {
    const auto departed = store.add(launch::key(who.attempt, "departed"), 0);
    const auto failed = store.add(launch::key(who.attempt, "errors"), 0);
    if (departed + failed >= who.world_size) return;
    if (std::chrono::steady_clock::now() > deadline) {
      std::fprintf(stderr, "dtrain: rank 0 leaves, and its store closes, after waiting %lld ms for the other ranks to "
                   "depart: %lld of %d departed, %lld failed\n", static_cast<long long>(patience.count()),
                   static_cast<long long>(departed), who.world_size, static_cast<long long>(failed));
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// The driver: starts each worker group, watches it, restarts it while FailureConfig allows, and
// records the run.
DTRAIN_INLINE Result Driver::drive() {
  launch::StopSignals stop_signals;  // SIGINT/SIGTERM stop the workers (run_group), then the run
  launch::warn_if_generic_blas_kernel();
  // A fresh start moves the earlier run aside before any worker can see it.
  if (run_.start == Start::fresh)
    if (const auto old = RunDirectory(run_.path()).move_aside())
      std::fprintf(stderr, "dtrain: a fresh start of %s: the earlier run was moved to %s\n", run_.path().c_str(),
                   old->c_str());
  RunDirectory(run_.path()).create();
  // What a cut-short write left (a full disk, a killed driver) goes before anything is written:
  // the disk may be full of it.
  remove_unfinished_writes();
  const auto addr = launch::detail::env("MASTER_ADDR").value_or("127.0.0.1");
  const int port = launch::master_port(0);
  // Only this run's processes count in its store: the workers get the secret in their environment
  // (one the user gave, for launchers, or a fresh one). docs/security.md.
  const auto secret = launch::run_secret_from_environment().value_or(launch::make_run_secret());
  auto store = launch::host_store(addr, port, run_.rendezvous_timeout, secret);

  // A resume_from that cannot be used fails here, before any worker starts.
  if (policies_.persists) {
    std::string why;
    if (run_.resume_from && !checkpointer::latest_valid(run_.path(), /*warn=*/false) &&
        !checkpointer::Checkpoint::open(*run_.resume_from, &why))
      throw ConfigError("RunConfig::resume_from " + run_.resume_from->string() + " cannot be resumed from: " +
                        why + "; and " + run_.path().string() +
                        " holds no valid checkpoint either. Point resume_from at a checkpoint_NNNNNN "
                        "directory whose manifest verifies, or unset it to start afresh.");
  }

  launch::ElasticSize sizes(scaling_);  // each group's size: num_workers unless elastic
  int n = sizes.size();
  const std::string threads = std::to_string(scaling_.threads_per_worker);
  const Variables variables = [&](int rank, int attempt) {
    return std::vector<std::pair<std::string, std::string>>{
        {"RANK", std::to_string(rank)}, {"WORLD_SIZE", std::to_string(n)},
        {"LOCAL_RANK", std::to_string(rank)}, {"LOCAL_WORLD_SIZE", std::to_string(n)},
        {"GROUP_RANK", "0"}, {"MASTER_ADDR", addr}, {"MASTER_PORT", std::to_string(store->getPort())},
        {launch::env_store_on_driver, "1"}, {launch::env_attempt, std::to_string(attempt)},
        {launch::env_run_path, run_.path().string()},
        {launch::env_run_secret, secret},
        {"OMP_NUM_THREADS", threads}, {"OPENBLAS_NUM_THREADS", threads}};
  };

  // Forking skips a second load of LibTorch (half a second) and shares what the code before
  // fit() built. It is safe while each worker runs one OpenMP thread: GNU OpenMP's thread pool
  // does not survive fork, and CUDA cannot be used in a fork of a process that touched it. Other
  // workers are fresh processes of this executable, which run the code before fit() again.
  const bool fork_workers = scaling_.threads_per_worker == 1 && !policies_.names.uses_gpu;
  // The Tracker records the run: params and "running" now, the outcome when it ends.
  auto record = tracking(scaling_);
  record.beat();  // the driver beats: outcome.json's heartbeat_time, renewed while the run goes on
  record.start();
  const std::function<void()> beat = [&] { record.beat(); };
  record.group_started(0, n, resume_step(*store), "start");

  // Each failure of a group, described; a new group (attempt + 1, fresh store keys) resumes from
  // the latest valid checkpoint while FailureConfig's rules allow (launch/restarts.hpp).
  launch::Restarts restarts(run_.failure);
  for (int attempt = 0;; ++attempt) {
    std::optional<std::string> failure;
    try {
      failure = run_group(*store, n, attempt, fork_workers, variables, beat);
    } catch (const std::exception& e) {  // the group could not be started or watched
      remove_unfinished_writes();
      auto result = record.end("failed", restarts.restarted(), e.what());
      if (run_.failure.throw_on_failure) throw;
      return result;
    }
    // Every worker has ended: what their writes left unfinished goes, and gives back its space
    // (the outcome can then be recorded on a disk that a checkpoint filled).
    remove_unfinished_writes();
    // A signal stops the run unless every loop had run out of work before the stop took effect.
    if (launch::stop_signals_received() > 0) {
      if (failure || stop_killed_ || store->check({launch::stopped_early_key(attempt)}) ||
          store->check({launch::key(attempt, launch::regroup_key)}))
        return stop_run(record, restarts.restarted());
      std::fprintf(stderr, "dtrain: the workers finished their work before the stop took effect; the run "
                   "is recorded finished\n");
    }
    if (!failure) {
      if (!store->check({launch::key(attempt, launch::regroup_key)})) break;
      const auto why = sizes.after_regroup();
      std::fprintf(stderr, "dtrain: the group of %d workers grows back to %d from its latest checkpoint\n", n,
                   sizes.size());
      n = sizes.size();
      record.group_started(attempt + 1, n, resume_step(*store), why);
      continue;
    }
    // A checkpoint a worker could not load is passed over, as a damaged one is: a restart, but
    // not a failure of the training (max_failures). Each time, one checkpoint fewer remains.
    const auto resumed = resume_point(*store);
    const std::int64_t resumed_step = resumed ? resumed->second : 0;
    if (const auto unloadable = launch::key(attempt, "checkpoint_unloadable"); store->check({unloadable})) {
      std::fprintf(stderr, "dtrain: %s; restarting the worker group from an older checkpoint\n", failure->c_str());
      restarts.passed_over(record.outcome()["failures"],
                           "checkpoint " + launch::to_string(store->get(unloadable)) +
                               " cannot be loaded into this run and is passed over: " + *failure,
                           attempt, resumed);
      record.group_started(attempt + 1, n, resumed_step, "restart");
      continue;
    }
    const bool config_error = store->check({launch::key(attempt, "config_error")});
    if (auto fatal = restarts.failed(record.outcome()["failures"], std::move(*failure), attempt, resumed, config_error)) {
      try {
        auto result = record.end("failed", restarts.restarted() - 1, *fatal, failed_rank_);
        if (!run_.failure.throw_on_failure) return result;
      } catch (const std::exception& e) {  // the training error matters more
        std::fprintf(stderr, "dtrain: warning: the tracker could not record the failure: %s\n", e.what());
      }
      throw WorkerError(*fatal);
    }
    // The same rank again with no newer checkpoint: that worker is lost, the next group is smaller.
    const std::int64_t step = resumed_step;
    const auto why = sizes.after_failure(failed_rank_, step);
    if (why == "shrink")
      std::fprintf(stderr, "dtrain: rank %d ended the group again with no newer checkpoint: continuing with %d "
                   "workers (ScalingConfig::min_workers = %d)\n", failed_rank_, sizes.size(), scaling_.minimum_workers());
    n = sizes.size();
    record.group_started(attempt + 1, n, step, why);
    restarts.back_off(beat);
  }

  return record.end("finished", restarts.restarted(), "");
}

// A run stopped by SIGINT or SIGTERM: recorded as "stopped" (MLflow's KILLED); a re-run of the
// same name resumes from its latest checkpoint.
DTRAIN_INLINE Result Driver::stop_run(tracking::RunTracking& record, int restarts) const {
  const std::string msg = launch::stop_message("the driver", run_.path(), policies_.persists);
  std::fprintf(stderr, "dtrain: %s\n", msg.c_str());
  auto result = record.end("stopped", restarts, msg);
  if (run_.failure.throw_on_failure) throw Stopped(msg);
  return result;
}

// Starts one group, waits for it; the description of its failure, or nothing when every rank
// ended with status 0. On the first abnormal end the rest are killed at once.
DTRAIN_INLINE std::optional<std::string> Driver::run_group(c10d::Store& store, int n, int attempt, bool fork_workers,
                                                         const Variables& variables, const std::function<void()>& beat) {
  launch::WorkerGroup group;
  std::optional<launch::BlasThreadsForWorkers> blas;
  if (fork_workers) blas.emplace(scaling_.threads_per_worker);
  for (int r = 0; r < n; ++r) try {
    if (fork_workers) {
      group.start_fork([&] {
        for (const auto& [k, v] : variables(r, attempt)) ::setenv(k.c_str(), v.c_str(), 1);
        run_worker(*launch::detect_worker());
      });
    } else {
      std::vector<std::string> names;
      for (const auto& [k, v] : variables(r, attempt)) names.push_back(k);
      auto env = launch::current_environment(names);
      for (const auto& [k, v] : variables(r, attempt)) env.push_back(k + "=" + v);
      group.start_exec(launch::own_command_line(), env);
    }
  } catch (const Error& e) {  // a worker that cannot be started fails the group as that rank
    group.kill_all();
    group.reap_all();
    failed_rank_ = r;
    return "training failed: rank " + std::to_string(r) + " could not be started: " + e.what();
  }
  blas.reset();
  stop_killed_ = false;
  std::optional<std::chrono::steady_clock::time_point> stop_deadline;
  // Finds ranks that are alive but stuck, even when no rank waits for them (every rank stuck).
  launch::ProgressWatchdog watchdog(store, attempt, n, run_.failure.progress_timeout);
  while (group.running_count() > 0) {
    beat();
    if (launch::stop_signals_received() > 0 && !stop_deadline) {  // ask the workers to stop
      stop_deadline = std::chrono::steady_clock::now() + run_.failure.stop_grace;
      std::fprintf(stderr, "dtrain: stopping the workers (up to %g s for the loop to stop and a checkpoint "
                   "to be written; a second signal kills them at once)\n",
                   std::chrono::duration<double>(run_.failure.stop_grace).count());
      // Through the store, not a forwarded signal: a Ctrl-C has reached the workers already (it
      // goes to the whole process group), and a second signal would kill them.
      try {
        store.set(launch::stop_key(attempt), launch::to_bytes("1"));
      } catch (const std::exception&) {  // the store is the driver's own: only a bug gets here
      }
    }
    if (stop_deadline && (launch::stop_signals_received() > 1 || std::chrono::steady_clock::now() > *stop_deadline)) {
      group.kill_all();
      group.reap_all();
      stop_killed_ = true;
      return std::nullopt;  // the caller records the stop
    }
    if (auto stuck = stop_deadline ? std::nullopt : watchdog.check([&](int r) { return group.running(r); })) {
      // Killed at once, as after any failure: a stuck loop would not return at a stop request.
      std::fprintf(stderr, "dtrain: %s; killing the group\n", stuck->cause.c_str());
      group.kill_all();
      group.reap_all();
      failed_rank_ = stuck->rank;
      return stuck->cause;
    }
    auto ended = group.poll();
    if (!ended) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      continue;
    }
    if (ended->ok()) continue;
    if (stop_deadline) {  // a worker died while stopping: its peers' collectives cannot complete
      group.kill_all();
      group.reap_all();
      stop_killed_ = true;
      return std::nullopt;
    }
    // One rank failed: stop the rest at once, then say who failed first and why.
    ended = launch::first_cause(group, *ended);
    group.kill_all();
    group.reap_all();
    failed_rank_ = ended->rank;
    return launch::describe_failure(store, *ended, n, attempt);
  }
  return std::nullopt;
}

// Where the next group resumes: the iteration and steps of the run directory's latest valid
// checkpoint that no worker of this run found it could not load (nothing and 0: from the start).
DTRAIN_INLINE std::optional<std::pair<std::int64_t, std::int64_t>> Driver::resume_point(c10d::Store& store) const {
  if (!policies_.persists) return std::nullopt;
  auto unloadable = [&](const std::filesystem::path& dir) {
    return store.check({checkpointer::unloadable_key(dir)}) ? std::string("unloadable") : std::string();
  };
  if (auto ck = checkpointer::latest_valid(run_.path(), /*warn=*/false, unloadable))
    return std::pair{ck->iteration(), ck->steps()};
  return std::nullopt;
}

// Removes what writes cut short left in the run directory (only while no worker of this run
// writes: before a group starts, after it ended), saying so when there was any.
DTRAIN_INLINE void Driver::remove_unfinished_writes() const {
  if (const auto removed = RunDirectory(run_.path()).remove_unfinished_writes(); !removed.empty())
    std::fprintf(stderr, "dtrain: removed what cut-short writes left in %s: %s\n", run_.path().c_str(),
                 removed.c_str());
}

DTRAIN_INLINE Result fit_trainer(const ScalingConfig& scaling, const RunConfig& run, const TrainerPolicies& policies,
                                 const TrainLoop& train) {
  return Driver(scaling, run, policies, train).fit();
}

}  // namespace detail

DTRAIN_NAMESPACE_END
