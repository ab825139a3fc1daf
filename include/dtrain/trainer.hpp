// SPDX-License-Identifier: Apache-2.0
#pragma once
// Trainer<Model, Dataset, Policies...>: run a train loop data-parallel on N worker processes.

#include <concepts>
#include <type_traits>
#include <utility>

#include <torch/nn/module.h>

#include <dtrain/checkpointer/model_config.hpp>
#include <dtrain/concept/strategy.hpp>
#include <dtrain/config.hpp>
#include <dtrain/context.hpp>
#include <dtrain/data/dataset.hpp>
#include <dtrain/policy/resolve.hpp>
#include <dtrain/result.hpp>
#include <dtrain/trainer/driver.hpp>

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
    // Only this depends on the Trainer's types: the Context and the loop in it. The rest of fit()
    // is trainer/driver.hpp's, compiled once.
    const detail::TrainLoop train = [&](const launch::WorkerIdentity& who, c10::intrusive_ptr<c10d::Store> store) {
      context ctx(who, std::move(store), scaling_, run_);
      loop(ctx);
      ctx.finish();
      return ctx.stopped();
    };
    using strategy = strategy_traits<typename policies::strategy>;
    const detail::TrainerPolicies described{tracking::policy_names<policies>(),
                                            tracking::TrackerHooks::of<typename policies::tracker>(),
                                            policies::checkpointer::state::persists, strategy::shards_optimizer,
                                            strategy::reshards_optimizer};
    return detail::fit_trainer(scaling_, run_, described, train);
  }

 private:
  ScalingConfig scaling_;
  RunConfig run_;
};

DTRAIN_NAMESPACE_END
