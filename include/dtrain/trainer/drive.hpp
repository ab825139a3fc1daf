// SPDX-License-Identifier: Apache-2.0
#pragma once
// The driver's side of Trainer (trainer.hpp holds the class): each worker group started, watched,
// stopped on a signal and restarted from the latest checkpoint while FailureConfig allows, and
// the run recorded from start to end, with the driver's heartbeat in outcome.json.

#include <dtrain/trainer.hpp>

DTRAIN_NAMESPACE_BEGIN

template <class Model, class Dataset, class... Policies>
template <class Loop>
Result Trainer<Model, Dataset, Policies...>::drive(Loop& loop) {
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
  if constexpr (persists) {
    std::string why;
    if (run_.resume_from && !checkpointer::latest_valid(run_.path(), /*warn=*/false) &&
        !Checkpoint::open(*run_.resume_from, &why))
      throw ConfigError("RunConfig::resume_from " + run_.resume_from->string() + " cannot be resumed from: " +
                        why + "; and " + run_.path().string() +
                        " holds no valid checkpoint either. Point resume_from at a checkpoint_NNNNNN "
                        "directory whose manifest verifies, or unset it to start afresh.");
  }

  launch::ElasticSize sizes(scaling_);  // each group's size: num_workers unless elastic
  int n = sizes.size();
  const std::string threads = std::to_string(scaling_.threads_per_worker);
  auto variables = [&](int rank, int attempt) {
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
  const bool fork_workers = scaling_.threads_per_worker == 1 && !policies::backend::uses_cuda;
  // The Tracker records the run: params and "running" now, the outcome when it ends.
  tracking::RunTracking<policies> record(scaling_, run_);
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
      failure = run_group(loop, *store, n, attempt, fork_workers, variables, beat);
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

// Starts one group, waits for it; the description of its failure, or nothing when every rank
// ended with status 0. On the first abnormal end the rest are killed at once.
template <class Model, class Dataset, class... Policies>
template <class Loop, class Variables>
std::optional<std::string> Trainer<Model, Dataset, Policies...>::run_group(Loop& loop, c10d::Store& store, int n, int attempt,
                                                                         bool fork_workers, Variables& variables,
                                                                         const std::function<void()>& beat) {
  launch::WorkerGroup group;
  std::optional<launch::BlasThreadsForWorkers> blas;
  if (fork_workers) blas.emplace(scaling_.threads_per_worker);
  for (int r = 0; r < n; ++r) try {
    if (fork_workers) {
      group.start_fork([&] {
        for (const auto& [k, v] : variables(r, attempt)) ::setenv(k.c_str(), v.c_str(), 1);
        run_worker(*launch::detect_worker(), loop);
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

DTRAIN_NAMESPACE_END
