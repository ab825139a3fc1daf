#pragma once
// Trainer<Model, Dataset, Policies...>: run a train loop data-parallel on N worker processes.

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/utils.h>

#include <dtrain/config.hpp>
#include <dtrain/context.hpp>
#include <dtrain/data/dataset.hpp>
#include <dtrain/error.hpp>
#include <dtrain/launch/environment.hpp>
#include <dtrain/launch/process.hpp>
#include <dtrain/launch/rendezvous.hpp>
#include <dtrain/policy/resolve.hpp>
#include <dtrain/result.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace detail {
/// Intra-op threads for this worker, and as many for OpenBLAS, whose own pool would otherwise
/// compete with torch's (OPENBLAS_NUM_THREADS is read only when the library loads, so a forked
/// worker needs the call).
inline void set_worker_threads(int n) {
  torch::set_num_threads(n);
  using setter = void (*)(int);
  if (auto set_blas = reinterpret_cast<setter>(::dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) set_blas(n);
}

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
  using context = Context<policies>;
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
    if (auto who = launch::detect_worker()) run_worker(*who, loop);
    return drive(loop);
  }

 private:
  template <class Loop>
  [[noreturn]] void run_worker(const launch::WorkerIdentity& who, Loop& loop) {
    int status = 0;
    c10::intrusive_ptr<c10d::Store> store;
    try {
      detail::set_worker_threads(scaling_.threads_per_worker);
      store = launch::connect_store(who, run_.rendezvous_timeout);
      launch::rendezvous(*store, who, run_.rendezvous_timeout);
      context ctx(who, store, scaling_, run_);
      loop(ctx);
      ctx.finish();
      depart(*store, who);
    } catch (const std::exception& e) {
      status = 1;
      const std::string what = e.what();
      std::fprintf(stderr, "dtrain: rank %d failed: %s\n", who.rank, what.c_str());
      if (store) {
        try {
          store->set(launch::key(who.attempt, "error/" + std::to_string(who.rank)),
                     launch::to_bytes(std::to_string(detail::unix_now()) + " " + what));
          store->add(launch::key(who.attempt, "errors"), 1);
        } catch (...) {  // the store went away with the driver: stderr has it
        }
      }
    }
    std::cout.flush();
    std::fflush(nullptr);
    // Skip static destructors: Gloo's and the store's threads may still be blocked on peers.
    std::_Exit(status);
  }

  // Under an external launcher rank 0 hosts the store: it leaves last.
  static void depart(c10d::Store& store, const launch::WorkerIdentity& who) {
    store.add(launch::key(who.attempt, "departed"), 1);
    if (who.store_on_driver || who.rank != 0) return;
    while (store.add(launch::key(who.attempt, "departed"), 0) < who.world_size)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }

  template <class Loop>
  Result drive(Loop& loop) {
    namespace fs = std::filesystem;
    fs::create_directories(run_.path());
    const auto addr = launch::detail::env("MASTER_ADDR").value_or("127.0.0.1");
    const int port = launch::detail::env_int("MASTER_PORT", 0);
    auto store = launch::host_store(addr, port, run_.rendezvous_timeout);

    const int n = scaling_.num_workers;
    const std::string threads = std::to_string(scaling_.threads_per_worker);
    auto variables = [&](int rank) {
      return std::vector<std::pair<std::string, std::string>>{
          {"RANK", std::to_string(rank)}, {"WORLD_SIZE", std::to_string(n)},
          {"LOCAL_RANK", std::to_string(rank)}, {"LOCAL_WORLD_SIZE", std::to_string(n)},
          {"GROUP_RANK", "0"}, {"MASTER_ADDR", addr}, {"MASTER_PORT", std::to_string(store->getPort())},
          {launch::env_store_on_driver, "1"}, {launch::env_attempt, "0"},
          {"OMP_NUM_THREADS", threads}, {"OPENBLAS_NUM_THREADS", threads}};
    };

    // Forking skips a second load of LibTorch (half a second) and shares what the code before
    // fit() built. It is safe while each worker runs one OpenMP thread: GNU OpenMP's thread pool
    // does not survive fork, and CUDA cannot be used in a fork of a process that touched it. Other
    // workers are fresh processes of this executable, which run the code before fit() again.
    const bool fork_workers = scaling_.threads_per_worker == 1 && !policies::backend::uses_cuda;
    launch::WorkerGroup group;
    for (int r = 0; r < n; ++r) {
      if (fork_workers) {
        group.start_fork([&] {
          for (const auto& [k, v] : variables(r)) ::setenv(k.c_str(), v.c_str(), 1);
          run_worker(*launch::detect_worker(), loop);
        });
      } else {
        std::vector<std::string> names;
        for (const auto& [k, v] : variables(r)) names.push_back(k);
        auto env = launch::current_environment(names);
        for (const auto& [k, v] : variables(r)) env.push_back(k + "=" + v);
        group.start_exec(launch::own_command_line(), env);
      }
    }
    while (group.running_count() > 0) {
      auto ended = group.poll();
      if (!ended) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        continue;
      }
      if (ended->ok()) continue;
      // One rank failed: stop the rest at once, then say who failed first and why.
      group.kill_all();
      group.reap_all();
      throw WorkerError(describe_failure(*store, *ended, n));
    }

    Result result;
    result.path = run_.path();
    result.metrics_history = MetricsHistory::read_jsonl(run_.path() / "metrics.jsonl");
    if (!result.metrics_history.empty()) result.metrics = result.metrics_history.rows().back();
    return result;
  }

  // The rank whose error was recorded first is the cause; the others usually lost their peer.
  static std::string describe_failure(c10d::Store& store, const launch::ExitStatus& ended, int n) {
    std::vector<std::pair<double, std::string>> errors;
    for (int r = 0; r < n; ++r) {
      const auto k = launch::key(0, "error/" + std::to_string(r));
      if (!store.check({k})) continue;
      const auto text = launch::to_string(store.get(k));
      const auto space = text.find(' ');
      errors.emplace_back(std::stod(text.substr(0, space)), "rank " + std::to_string(r) + ": " + text.substr(space + 1));
    }
    std::sort(errors.begin(), errors.end());
    std::string msg = "training failed: rank " + std::to_string(ended.rank) + " " + ended.describe();
    if (!errors.empty()) {
      msg += "; first error: " + errors.front().second;
      for (std::size_t i = 1; i < errors.size(); ++i) msg += "; then " + errors[i].second;
    }
    return msg;
  }

  ScalingConfig scaling_;
  RunConfig run_;
};

DTRAIN_NAMESPACE_END
