// SPDX-License-Identifier: Apache-2.0
#pragma once
// Trainer<Model, Dataset, Policies...>: run a train loop data-parallel on N worker processes.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/utils.h>

#include <dtrain/checkpointer/checkpoint.hpp>
#include <dtrain/checkpointer/selection.hpp>
#include <dtrain/config.hpp>
#include <dtrain/context.hpp>
#include <dtrain/data/dataset.hpp>
#include <dtrain/error.hpp>
#include <dtrain/launch/elastic.hpp>
#include <dtrain/launch/environment.hpp>
#include <dtrain/launch/fresh_start.hpp>
#include <dtrain/launch/heartbeat.hpp>
#include <dtrain/launch/process.hpp>
#include <dtrain/launch/rendezvous.hpp>
#include <dtrain/launch/restarts.hpp>
#include <dtrain/launch/stop.hpp>
#include <dtrain/launch/worker_threads.hpp>
#include <dtrain/memory.hpp>
#include <dtrain/policy/resolve.hpp>
#include <dtrain/result.hpp>
#include <dtrain/run_directory.hpp>
#include <dtrain/tracking/record.hpp>
#include <dtrain/tracking/run_tracking.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace detail {
template <class M>
struct module_of {
  using type = M;
};
template <class M>
struct module_of<torch::nn::ModuleHolder<M>> {
  using type = M;
};
template <class M>
  requires std::is_base_of_v<torch::nn::ModuleHolder<typename M::ContainedType>, M>
struct module_of<M> {
  using type = typename M::ContainedType;
};
}  // namespace detail

/// Runs `loop(ctx)` on `ScalingConfig::num_workers` processes, data-parallel.
///
/// - Model: the network type (a torch::nn::Module, or its TORCH_MODULE holder).
/// - Dataset: what the loop trains on: a data::RandomAccess dataset or a data::Splits bundle such
///   as data::FashionMnist.
/// - Policies: at most one per category, in any order; missing ones default to backend::gloo,
///   sampler::distributed<>, checkpointer::none, strategy::ddp<> and precision::fp32.
///
/// fit() in a plain process is the driver: it starts the workers (copies of this executable with
/// torchrun's variables set), watches them and returns the Result. In a worker (started by the
/// driver, torchrun, Slurm or Open MPI) fit() runs the loop for this rank and ends the process.
template <class Model, class Dataset, class... Policies>
class Trainer {
  static_assert(std::is_base_of_v<torch::nn::Module, typename detail::module_of<Model>::type>,
                "dtrain::Trainer<Model, ...>: Model must be a torch::nn::Module subclass or its "
                "TORCH_MODULE holder (e.g. struct NetImpl : torch::nn::Module {...}; TORCH_MODULE(Net);).");
  static_assert(data::RandomAccess<Dataset> || data::Splits<Dataset>,
                "dtrain::Trainer<Model, Dataset, ...>: Dataset must model dtrain::data::RandomAccess "
                "(size() and get_batch(indices)) or dtrain::data::Splits (train() returning one), "
                "like dtrain::data::FashionMnist or dtrain::data::TensorDataset.");

 public:
  using policies = policy::set<Policies...>;
  // Instantiates the policy set here, so a misconfigured Trainer is rejected where it is declared
  // (with the set's own messages), not only once fit() is instantiated.
  static_assert(sizeof(policies) > 0);
  using context = Context<policies>;
  /// Whether the workers train on GPUs (one per worker, cuda:LOCAL_RANK): the backend decides.
  static constexpr bool uses_gpu = policies::backend::uses_cuda;
  using model_type = Model;
  using dataset_type = Dataset;

  explicit Trainer(ScalingConfig scaling = {}, RunConfig run = {})
      : scaling_(std::move(scaling)), run_(std::move(run)) {}

  const ScalingConfig& scaling_config() const { return scaling_; }
  const RunConfig& run_config() const { return run_; }

  /// In the driver: starts the workers, waits for them and returns the Result; throws WorkerError
  /// naming the rank and cause when one fails, ConfigError or RendezvousError for what stops the
  /// start. In a worker: runs `loop(ctx)` and ends the process (status 0, or 1 after an error).
  template <class Loop>
    requires std::invocable<Loop&, context&>
  Result fit(Loop&& loop) {
    scaling_.validate();
    run_.validate();
    launch::check_elastic(scaling_, persists, strategy_traits<typename policies::strategy>::shards_optimizer,
                          strategy_traits<typename policies::strategy>::reshards_optimizer);
    if (!persists && run_.resume_from)
      throw ConfigError("RunConfig::resume_from is set but the Trainer's Checkpointer is checkpointer::none, "
                        "which neither writes nor reads checkpoints; add dtrain::checkpointer::directory<> "
                        "to the Trainer's policies");
    if (auto who = launch::detect_worker()) run_worker(*who, loop);
    return drive(loop);
  }

 private:
  static constexpr bool persists = policies::checkpointer::state::persists;

  template <class Loop>
  [[noreturn]] void run_worker(const launch::WorkerIdentity& who, Loop& loop) {
    int status = 0;
    c10::intrusive_ptr<c10d::Store> store;
    // Under torchrun, Slurm or Open MPI no driver of ours records the run: rank 0 does, the same way.
    std::optional<tracking::RunTracking<policies>> tracked;
    try {
      launch::install_worker_stop_handlers();
      launch::set_worker_threads(scaling_.threads_per_worker);
      if (!who.store_on_driver && who.local_rank == 0) launch::warn_if_generic_blas_kernel();  // once a host
      retain_freed_memory_by_default();
      store = launch::connect_store(who, run_.rendezvous_timeout);
      launch::rendezvous(*store, who, run_.rendezvous_timeout);
      if (!who.store_on_driver && run_.start == Start::fresh)  // no driver of ours moved the old run aside
        launch::start_fresh_under_launcher(*store, who, run_.path(), run_.rendezvous_timeout);
      if (!who.store_on_driver && who.rank == 0) tracked.emplace(start_tracking(who));
      context ctx(who, store, scaling_, run_);
      loop(ctx);
      ctx.finish();
      if (tracked)
        tracked->end(ctx.stopped() ? "stopped" : "finished", who.attempt,
                     ctx.stopped() ? launch::stop_message("the workers", run_.path(), persists) : "");
      depart(*store, who);
    } catch (const launch::Regroup&) {  // an elastic group's checkpoint to grow back from is complete
      depart(*store, who);
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
  tracking::RunTracking<policies> start_tracking(const launch::WorkerIdentity& who) const {
    RunDirectory(run_.path()).create();
    ScalingConfig launched = scaling_;
    launched.num_workers = who.world_size;  // the launcher's count, not the driver's setting
    launched.min_workers.reset();           // the launcher's range (torchrun --nnodes MIN:MAX) is its own
    tracking::RunTracking<policies> t(launched, run_);
    const auto step = latest_step();
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

  // Under an external launcher rank 0 hosts the store: it leaves last.
  static void depart(c10d::Store& store, const launch::WorkerIdentity& who) {
    store.add(launch::key(who.attempt, "departed"), 1);
    if (who.store_on_driver || who.store_on_agent || who.rank != 0) return;
    while (store.add(launch::key(who.attempt, "departed"), 0) < who.world_size)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }

  template <class Loop>
  Result drive(Loop& loop) {
    launch::StopSignals stop_signals;  // SIGINT/SIGTERM stop the workers (run_group), then the run
    launch::warn_if_generic_blas_kernel();
    // A fresh start moves the earlier run aside before any worker can see it.
    if (run_.start == Start::fresh)
      if (const auto old = RunDirectory(run_.path()).move_aside())
        std::fprintf(stderr, "dtrain: a fresh start of %s: the earlier run was moved to %s\n", run_.path().c_str(),
                     old->c_str());
    RunDirectory(run_.path()).create();
    const auto addr = launch::detail::env("MASTER_ADDR").value_or("127.0.0.1");
    const int port = launch::master_port(0);
    auto store = launch::host_store(addr, port, run_.rendezvous_timeout);

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
          {"OMP_NUM_THREADS", threads}, {"OPENBLAS_NUM_THREADS", threads}};
    };

    // Forking skips a second load of LibTorch (half a second) and shares what the code before
    // fit() built. It is safe while each worker runs one OpenMP thread: GNU OpenMP's thread pool
    // does not survive fork, and CUDA cannot be used in a fork of a process that touched it. Other
    // workers are fresh processes of this executable, which run the code before fit() again.
    const bool fork_workers = scaling_.threads_per_worker == 1 && !policies::backend::uses_cuda;
    // The Tracker records the run: params and "running" now, the outcome when it ends.
    tracking::RunTracking<policies> record(scaling_, run_);
    record.start();
    record.group_started(0, n, latest_step(), "start");

    // Each failure of a group, described; a new group (attempt + 1, fresh store keys) resumes from
    // the latest valid checkpoint while FailureConfig's rules allow (launch/restarts.hpp).
    launch::Restarts restarts(run_.failure);
    for (int attempt = 0;; ++attempt) {
      std::optional<std::string> failure;
      try {
        failure = run_group(loop, *store, n, attempt, fork_workers, variables);
      } catch (const std::exception& e) {  // the group could not be started or watched
        auto result = record.end("failed", restarts.count(), e.what());
        if (run_.failure.throw_on_failure) throw;
        return result;
      }
      // A signal stops the run unless every loop had run out of work before the stop took effect.
      if (launch::stop_signals_received() > 0) {
        if (failure || stop_killed_ || store->check({launch::stopped_early_key(attempt)}) ||
            store->check({launch::key(attempt, launch::regroup_key)}))
          return stop_run(record, restarts.count());
        std::fprintf(stderr, "dtrain: the workers finished their work before the stop took effect; the run "
                     "is recorded finished\n");
      }
      if (!failure) {
        if (!store->check({launch::key(attempt, launch::regroup_key)})) break;
        const auto why = sizes.after_regroup();
        std::fprintf(stderr, "dtrain: the group of %d workers grows back to %d from its latest checkpoint\n", n,
                     sizes.size());
        n = sizes.size();
        record.group_started(attempt + 1, n, latest_step(), why);
        continue;
      }
      // A checkpoint a worker could not load is passed over, as a damaged one is: not a failure of
      // the training. Each time, one checkpoint fewer remains, so this ends.
      if (store->check({launch::key(attempt, "checkpoint_unloadable")})) {
        std::fprintf(stderr, "dtrain: %s; restarting the worker group from an older checkpoint\n", failure->c_str());
        record.group_started(attempt + 1, n, latest_step(), "restart");
        continue;
      }
      std::optional<std::pair<std::int64_t, std::int64_t>> resumed;
      if constexpr (persists)
        if (auto ck = checkpointer::latest_valid(run_.path(), /*warn=*/false)) resumed.emplace(ck->iteration(), ck->steps());
      const bool config_error = store->check({launch::key(attempt, "config_error")});
      if (auto fatal = restarts.failed(record.outcome()["failures"], std::move(*failure), attempt, resumed, config_error)) {
        try {
          auto result = record.end("failed", restarts.count() - 1, *fatal, failed_rank_);
          if (!run_.failure.throw_on_failure) return result;
        } catch (const std::exception& e) {  // the training error matters more
          std::fprintf(stderr, "dtrain: warning: the tracker could not record the failure: %s\n", e.what());
        }
        throw WorkerError(*fatal);
      }
      // The same rank again with no newer checkpoint: that worker is lost, the next group is smaller.
      const std::int64_t step = resumed ? resumed->second : 0;
      const auto why = sizes.after_failure(failed_rank_, step);
      if (why == "shrink")
        std::fprintf(stderr, "dtrain: rank %d ended the group again with no newer checkpoint: continuing with %d "
                     "workers (ScalingConfig::min_workers = %d)\n", failed_rank_, sizes.size(), scaling_.minimum_workers());
      n = sizes.size();
      record.group_started(attempt + 1, n, step, why);
      restarts.back_off();
    }

    return record.end("finished", restarts.count(), "");
  }

  // A run stopped by SIGINT or SIGTERM: recorded as "stopped" (MLflow's KILLED); a re-run of the
  // same name resumes from its latest checkpoint.
  Result stop_run(tracking::RunTracking<policies>& record, int restarts) const {
    const std::string msg = launch::stop_message("the driver", run_.path(), persists);
    std::fprintf(stderr, "dtrain: %s\n", msg.c_str());
    auto result = record.end("stopped", restarts, msg);
    if (run_.failure.throw_on_failure) throw Stopped(msg);
    return result;
  }

  // Starts one group, waits for it; the description of its failure, or nothing when every rank
  // ended with status 0. On the first abnormal end the rest are killed at once.
  template <class Loop, class Variables>
  std::optional<std::string> run_group(Loop& loop, c10d::Store& store, int n, int attempt, bool fork_workers,
                                       Variables& variables) {
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

  // The steps of the run directory's latest valid checkpoint, where the next group resumes (0: none).
  std::int64_t latest_step() const {
    if constexpr (persists)
      if (auto ck = checkpointer::latest_valid(run_.path(), /*warn=*/false)) return ck->steps();
    return 0;
  }

  ScalingConfig scaling_;
  RunConfig run_;
  int failed_rank_ = -1;  // the rank whose end failed the last group
  bool stop_killed_ = false;  // the last group was killed while stopping (grace over, second signal)
};

DTRAIN_NAMESPACE_END
