#pragma once
// The worker context: what the train loop gets, once per rank.

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <range/v3/view/iota.hpp>
#include <range/v3/view/transform.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/nn/module.h>
#include <torch/types.h>

#include <dtrain/config.hpp>
#include <dtrain/data/dataset.hpp>
#include <dtrain/data/shard.hpp>
#include <dtrain/error.hpp>
#include <dtrain/launch/environment.hpp>
#include <dtrain/launch/rendezvous.hpp>
#include <dtrain/metrics.hpp>
#include <dtrain/result.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace detail {
inline double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

/// A module handle prepare_model() accepts: a torch::nn::ModuleHolder (TORCH_MODULE(Net), Sequential)
/// or a std::shared_ptr to a torch::nn::Module.
template <class M>
concept ModuleHandle = requires(M m) {
  { *m } -> std::convertible_to<torch::nn::Module&>;
  m->to(torch::Device(torch::kCPU));
};
}  // namespace detail

/// What a rank's train loop is handed by Trainer::fit(): its place in the group, the policies'
/// per-worker state, and the calls that make a single-process loop data-parallel.
template <class Policies>
class Context {
  using backend = typename Policies::backend;
  using communicator_type = typename backend::communicator;
  using strategy_state = typename Policies::strategy::template state<communicator_type>;
  using precision_state = typename Policies::precision::state;

 public:
  Context(const launch::WorkerIdentity& who, c10::intrusive_ptr<c10d::Store> store,
          const ScalingConfig& scaling, const RunConfig& run)
      : who_(who),
        store_(std::move(store)),
        scaling_(scaling),
        run_(run),
        device_(backend::device(who.local_rank)),
        comm_(c10::make_intrusive<c10d::PrefixStore>(launch::key(who.attempt, "pg"), store_),
              who, run.collective_timeout),
        precision_(device_) {
    comm_.on_stall([this] { check_peers("a collective", false); });
    if (who_.rank == 0) {
      std::filesystem::create_directories(run_.path());
      // A fresh group starts a fresh history (resuming keeps it: the checkpoint issue).
      if (who_.attempt == 0) std::filesystem::remove(history_path());
    }
  }

  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  /// @name Where this worker is
  /// @{
  int world_rank() const { return who_.rank; }
  int world_size() const { return who_.world_size; }
  int local_rank() const { return who_.local_rank; }
  int local_world_size() const { return who_.local_world_size; }
  int node_rank() const { return who_.node_rank; }
  torch::Device device() const { return device_; }
  const RunConfig& run_config() const { return run_; }
  const ScalingConfig& scaling_config() const { return scaling_; }
  /// @}

  /// Moves the model to this worker's device and wraps it with the Strategy (for ddp<>: rank 0's
  /// weights broadcast, gradient hooks installed). Returns the same handle; the wrapping lives as
  /// long as this context. Call it once per model, on every rank, in the same order.
  template <detail::ModuleHandle Module>
  Module prepare_model(Module model) {
    model->to(device_);
    strategies_.push_back(std::make_unique<strategy_state>(static_cast<torch::nn::Module&>(*model), comm_));
    return model;
  }

  /// The Strategy's state of the i-th prepared model (its statistics, for instance).
  const strategy_state& strategy(std::size_t i = 0) const { return *strategies_.at(i); }

  /// Epochs `first` .. n-1, where `first` is 0 for a fresh run. Iterating sets epoch(), which
  /// the Sampler draws its permutation from: no set_epoch call is needed.
  auto epochs(std::int64_t n) {
    return ranges::views::iota(std::int64_t{0}, n) | ranges::views::transform([this](std::int64_t e) {
             epoch_ = e;
             return e;
           });
  }
  std::int64_t epoch() const { return epoch_; }

  /// This rank's batches of `split` for the current epoch: the Sampler's indices for this rank,
  /// global_batch / world_size samples at a time. Throws ConfigError when world_size does not
  /// divide global_batch.
  /// `Sampler` overrides the Trainer's for this call: ctx.shard<sampler::sequential>(test, b) gives
  /// every sample exactly once across ranks, for evaluation.
  template <class Sampler = typename Policies::sampler, data::RandomAccess Split>
  auto shard(const Split& split, std::int64_t global_batch) const {
    if (global_batch < 1 || global_batch % who_.world_size != 0)
      throw ConfigError("global batch " + std::to_string(global_batch) + " does not divide evenly among " +
                        std::to_string(who_.world_size) + " workers; choose a global batch that is a " +
                        "multiple of the worker count (e.g. " +
                        std::to_string(std::max<std::int64_t>(1, global_batch / who_.world_size) * who_.world_size) + ")");
    return data::batches(split,
                         Sampler::indices(static_cast<std::int64_t>(split.size()), who_.rank,
                                                    who_.world_size, epoch_),
                         global_batch / who_.world_size);
  }

  /// Autocast for the forward pass while the returned scope lives (a no-op under fp32).
  auto autocast() const { return precision_.autocast(); }

  /// Backward through the Precision policy (loss scaling where it applies); under ddp<> gradients
  /// are averaged over ranks when it returns. A plain loss.backward() synchronises too.
  void backward(const torch::Tensor& loss) { precision_.backward(loss); }

  /// The optimizer step through the Precision policy; returns false when it skipped the step.
  template <class Optimizer>
  bool step(Optimizer& opt) {
    const bool stepped = precision_.step(opt);
    ++steps_;
    return stepped;
  }
  /// Optimizer steps taken through step() on this rank.
  std::int64_t steps() const { return steps_; }

  /// While the returned guard lives, backward passes accumulate gradients locally without
  /// synchronising them (gradient accumulation: k-1 of every k micro-batches).
  [[nodiscard]] auto no_sync() {
    struct guard {
      Context* ctx;
      explicit guard(Context* c) : ctx(c) {
        for (auto& s : ctx->strategies_) s->set_sync(false);
      }
      guard(const guard&) = delete;
      ~guard() {
        for (auto& s : ctx->strategies_) s->set_sync(true);
      }
    };
    return guard{this};
  }

  /// Records `metrics` as one step of the run. A synchronised step: every rank must call it the
  /// same number of times; rank 0's metrics are the ones recorded. Throws WorkerError when a rank
  /// left the loop with fewer reports, or failed.
  void report(const Metrics& metrics) {
    ++reports_;
    arrive("report/" + std::to_string(reports_), "report() call " + std::to_string(reports_));
    if (who_.rank != 0) return;
    Metrics row = metrics;
    row.try_emplace("iteration", reports_);
    row.try_emplace("epoch", epoch_);
    row.try_emplace("step", steps_);
    row.try_emplace("timestamp", detail::unix_now());
    MetricsHistory::append_jsonl(history_path(), row);
  }
  /// report() calls made so far on this rank.
  std::int64_t reports() const { return reports_; }

  /// `value` reduced over all ranks (mean, sum, max or min); every rank gets the result.
  double all_reduce(double value, reduce op = reduce::mean) {
    auto t = torch::full({1}, value, torch::kFloat64);
    comm_.allreduce(t, op).wait();
    return t.item<double>();
  }

  /// The backend's communicator, for collectives of your own (same order on every rank).
  communicator_type& communicator() { return comm_; }

  /// Called by the Trainer when the loop returns: checks every rank reported equally often, waits
  /// for all, and writes the metrics table. Not for the loop to call.
  void finish() {
    store_->set(launch::key(who_.attempt, "finished/" + std::to_string(who_.rank)),
                launch::to_bytes(std::to_string(reports_)));
    arrive("finished", "the end of the train loop");
    for (int r = 0; r < who_.world_size; ++r) {
      const auto n = std::stoll(launch::to_string(store_->get(launch::key(who_.attempt, "finished/" + std::to_string(r)))));
      if (n != reports_)
        throw WorkerError("rank " + std::to_string(r) + " called report() " + std::to_string(n) +
                          " times and rank " + std::to_string(who_.rank) + " " + std::to_string(reports_) +
                          " times; every rank must call report() equally often");
    }
    if (who_.rank == 0) MetricsHistory::read_jsonl(history_path()).write_csv(run_.path() / "metrics.csv");
  }

  std::filesystem::path history_path() const { return run_.path() / "metrics.jsonl"; }

 private:
  // A store-based barrier named `what` in errors: waits until every rank arrived at `name`,
  // failing fast when a rank failed or left the loop with fewer reports.
  void arrive(const std::string& name, const std::string& what) {
    const auto k = launch::key(who_.attempt, name);
    store_->add(k, 1);
    const auto deadline = std::chrono::steady_clock::now() + run_.collective_timeout;
    auto pause = std::chrono::microseconds(20);
    while (store_->add(k, 0) < who_.world_size) {
      if (name == "finished") check_errors(what);
      else check_peers(what, true);
      if (std::chrono::steady_clock::now() > deadline)
        throw WorkerError("rank " + std::to_string(who_.rank) + " waited " +
                          std::to_string(run_.collective_timeout.count()) + " ms at " + what +
                          " for the other ranks; one of them hangs or skipped it");
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(5000));
    }
  }

  // Throws when waiting at `what` cannot end: a rank failed, or left the train loop without
  // getting here. At a report a rank that left after making this report is fine.
  void check_errors(const std::string& what) {
    if (store_->add(launch::key(who_.attempt, "errors"), 0) > 0)
      throw WorkerError("another rank failed while rank " + std::to_string(who_.rank) + " waited at " + what);
  }
  void check_peers(const std::string& what, bool at_report) {
    check_errors(what);
    for (int r = 0; r < who_.world_size; ++r) {
      const auto fk = launch::key(who_.attempt, "finished/" + std::to_string(r));
      if (r == who_.rank || !store_->check({fk})) continue;
      const auto n = std::stoll(launch::to_string(store_->get(fk)));
      if (!at_report || n < reports_)
        throw WorkerError("rank " + std::to_string(r) + " returned from the train loop after " + std::to_string(n) +
                          " report() calls while rank " + std::to_string(who_.rank) + " waits at " + what +
                          "; every rank must make the same report() calls and collectives");
    }
  }

  launch::WorkerIdentity who_;
  c10::intrusive_ptr<c10d::Store> store_;
  ScalingConfig scaling_;
  RunConfig run_;
  torch::Device device_;
  communicator_type comm_;
  precision_state precision_;
  std::vector<std::unique_ptr<strategy_state>> strategies_;
  std::int64_t epoch_ = 0, steps_ = 0, reports_ = 0;
};

DTRAIN_NAMESPACE_END
