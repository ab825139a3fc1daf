// SPDX-License-Identifier: Apache-2.0
#pragma once
// Trainer<Model, Dataset, Policies...>: run a train loop data-parallel on N worker processes.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
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
#include <dtrain/checkpointer/model_config.hpp>
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
    deny_world_write();  // nothing of the run world-writable, whatever the umask (docs/security.md)
    // A worker of a later fit() of this program (a training, then batch inference), started anew,
    // or a Tuner's trial, passes over this one: its run ended before the driver went on.
    if (const auto own = launch::detail::env(launch::env_run_path); own && *own != run_.path().string())
      return finished_earlier(*own);
    if (auto who = launch::detect_worker()) run_worker(*who, loop);
    return drive(loop);
  }

 private:
  static constexpr bool persists = policies::checkpointer::state::persists;

  Result finished_earlier(const std::string& own) const {
    try {
      return Result::from_path(run_.path());
    } catch (const std::exception& e) {
      throw ConfigError("this process (a worker, or a Tuner's trial) was started for the run at " + own + ", and the program called fit() of " +
                        run_.path().string() + " first, which the driver did not run (" + e.what() +
                        "); the driver and its workers must call fit() in the same order");
    }
  }

  template <class Loop>
  [[noreturn]] void run_worker(const launch::WorkerIdentity& who, Loop& loop) {
    int status = 0;
    c10::intrusive_ptr<c10d::Store> store;
    // Under torchrun, Slurm or Open MPI no driver of ours records the run: rank 0 does, the same way.
    std::optional<tracking::RunTracking<policies>> tracked;
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
      context ctx(who, store, scaling_, run_);
      loop(ctx);
      ctx.finish();
      if (tracked)
        tracked->end(ctx.stopped() ? "stopped" : "finished", who.attempt,
                     ctx.stopped() ? launch::stop_message("the workers", run_.path(), persists) : "");
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
  tracking::RunTracking<policies> start_tracking(const launch::WorkerIdentity& who, c10d::Store& store) const {
    RunDirectory(run_.path()).create();
    remove_unfinished_writes();  // before anything is written: a full disk may be full of them
    ScalingConfig launched = scaling_;
    launched.num_workers = who.world_size;  // the launcher's count, not the driver's setting
    launched.min_workers.reset();           // the launcher's range (torchrun --nnodes MIN:MAX) is its own
    tracking::RunTracking<policies> t(launched, run_);
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
  void depart(c10d::Store& store, const launch::WorkerIdentity& who) const {
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

  // The driver: starts each worker group, watches it, restarts it while FailureConfig allows,
  // and records the run (trainer/drive.hpp).
  template <class Loop>
  Result drive(Loop& loop);

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
                                       Variables& variables, const std::function<void()>& beat);

  // Where the next group resumes: the iteration and steps of the run directory's latest valid
  // checkpoint that no worker of this run found it could not load (nothing and 0: from the start).
  std::optional<std::pair<std::int64_t, std::int64_t>> resume_point(c10d::Store& store) const {
    if constexpr (persists) {
      auto unloadable = [&](const std::filesystem::path& dir) {
        return store.check({checkpointer::unloadable_key(dir)}) ? std::string("unloadable") : std::string();
      };
      if (auto ck = checkpointer::latest_valid(run_.path(), /*warn=*/false, unloadable))
        return std::pair{ck->iteration(), ck->steps()};
    }
    return std::nullopt;
  }
  std::int64_t resume_step(c10d::Store& store) const {
    const auto point = resume_point(store);
    return point ? point->second : 0;
  }

  // Removes what writes cut short left in the run directory (only while no worker of this run
  // writes: before a group starts, after it ended), saying so when there was any.
  void remove_unfinished_writes() const {
    if (const auto removed = RunDirectory(run_.path()).remove_unfinished_writes(); !removed.empty())
      std::fprintf(stderr, "dtrain: removed what cut-short writes left in %s: %s\n", run_.path().c_str(), removed.c_str());
  }

  ScalingConfig scaling_;
  RunConfig run_;
  int failed_rank_ = -1;  // the rank whose end failed the last group
  bool stop_killed_ = false;  // the last group was killed while stopping (grace over, second signal)
};

DTRAIN_NAMESPACE_END

#include <dtrain/trainer/drive.hpp>
