// SPDX-License-Identifier: Apache-2.0
#pragma once
// The worker context: what the train loop gets, once per rank. A facade over the parts that each
// own one concern: the group protocol (launch/group.hpp), the epoch cursor (sampler/cursor.hpp),
// the prepared models (context/models.hpp), the Checkpointer's state, the Precision's state and
// the progress meter (tracking/progress_meter.hpp).

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/types.h>

#include <dtrain/checkpointer/checkpoint.hpp>
#include <dtrain/checkpointer/model_config.hpp>
#include <dtrain/checkpointer/selection.hpp>
#include <dtrain/checkpointer/snapshot_buffers.hpp>
#include <dtrain/checkpointer/write.hpp>
#include <dtrain/collective.hpp>
#include <dtrain/concept/backend.hpp>
#include <dtrain/concept/precision.hpp>
#include <dtrain/concept/sampler.hpp>
#include <dtrain/concept/strategy.hpp>
#include <dtrain/config.hpp>
#include <dtrain/context/core.hpp>
#include <dtrain/context/graphed_step.hpp>
#include <dtrain/context/models.hpp>
#include <dtrain/context/stoppable.hpp>
#include <dtrain/data/dataset.hpp>
#include <dtrain/data/prefetch.hpp>
#include <dtrain/data/shard.hpp>
#include <dtrain/detail/memory.hpp>
#include <dtrain/error.hpp>
#include <dtrain/evaluation/classification.hpp>
#include <dtrain/launch/elastic.hpp>
#include <dtrain/launch/group.hpp>
#include <dtrain/launch/stop.hpp>
#include <dtrain/metrics.hpp>
#include <dtrain/precision/dense_gradients.hpp>
#include <dtrain/result.hpp>
#include <dtrain/run_directory.hpp>
#include <dtrain/sampler/cursor.hpp>
#include <dtrain/sampler/seed.hpp>
#include <dtrain/tracking/progress_meter.hpp>
#include <dtrain/tracking/report_timing.hpp>
#include <dtrain/tracking/record.hpp>

DTRAIN_NAMESPACE_BEGIN

/// What a rank's train loop is handed by Trainer::fit(): its place in the group, the policies'
/// per-worker state, and the calls that make a single-process loop data-parallel.
template <class Policies>
class Context {
  using backend = typename Policies::backend;
  using communicator_type = typename backend::communicator;
  using strategy_ops = strategy_traits<typename Policies::strategy>;
  using strategy_state = typename Policies::strategy::template state<communicator_type>;
  using precision_ops = precision_traits<typename Policies::precision>;
  using precision_state = typename Policies::precision::state;
  using checkpointer_state = typename Policies::checkpointer::state;
  using trainer_sampler = typename Policies::sampler;
  static constexpr bool persists = checkpointer_state::persists;

 public:
  Context(const launch::WorkerIdentity& who, c10::intrusive_ptr<c10d::Store> store, const ScalingConfig& scaling,
          const RunConfig& run);

  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  /// Whether the run is being stopped (SIGINT or SIGTERM to the driver, or to this worker under
  /// torchrun, Slurm or Kubernetes): true on every rank from the same optimizer step on, when
  /// ctx.shard() of the Trainer's Sampler ends and ctx.epochs() begins no more epochs, so a loop
  /// need not ask. Ask where a stopped loop should do less (skip a final evaluation), or in a
  /// loop built on neither. Costs a store read about every FailureConfig::stop_poll.
  bool should_stop() { return stopping(); }
  /// Ends the run early where `rule` says: at each report() rank 0 asks `rule(row)` (the row as
  /// recorded: the loop's metrics with iteration, epoch, step, timestamp, time_this_iter_s and
  /// time_total_s) and, once it answers true, should_stop() is true on every rank from that report
  /// on, so ctx.epochs() and ctx.shard() end as they do for a stop request. The run is recorded
  /// finished, not stopped: it ended where its own rule said (a target accuracy, a Tuner's
  /// scheduler). Only rank 0's rule is asked (other ranks may set one or not); the answer travels
  /// in report()'s own collective, so a rule costs no extra communication.
  void stop_when(std::function<bool(const Metrics&)> rule) { core_.stop_rule = std::move(rule); }
  /// Whether the stop_when() rule cut the loop short: it answered true at a report, and the loop
  /// then asked to go on (a loop that ended at that report anyway was not cut).
  bool stopped_by_rule() const { return core_.cut_by_rule; }
  /// Whether a stop request cut this loop short (should_stop() answered true): the driver records
  /// the run "stopped", and one whose loop ran out of work first "finished".
  bool stopped() const { return core_.stopped; }

  /// @name Where this worker is
  /// @{
  int world_rank() const { return core_.group.rank(); }
  int world_size() const { return core_.group.size(); }
  int local_rank() const { return core_.group.identity().local_rank; }
  int local_world_size() const { return core_.group.identity().local_world_size; }
  int node_rank() const { return core_.group.identity().node_rank; }
  torch::Device device() const { return core_.device; }
  const RunConfig& run_config() const { return core_.run; }
  const ScalingConfig& scaling_config() const { return core_.scaling; }
  /// How many times the driver restarted the group before this one (0 for the first group).
  int attempt() const { return core_.group.identity().attempt; }
  /// @}

  /// Moves the model to this worker's device and wraps it with the Strategy (for ddp<>: rank 0's
  /// weights broadcast, gradient hooks installed; for fsdp<>: parameters sharded, see
  /// strategy/fsdp.hpp). Returns the same handle; the wrapping lives as long as this context. Call
  /// it once per model, on every rank, in the same order.
  template <detail::ModuleHandle Module>
  Module prepare_model(Module model) {
    model->to(core_.device);
    models_.add(detail::as_module(model), comm_);
    return model;
  }

  /// The tensors to build the optimizer over: the model's parameters under ddp<>, this rank's
  /// flat shards under fsdp<> (so the optimizer's state is 1/N too). One line for both:
  /// `torch::optim::Adam opt(ctx.parameters(model), 1e-3);`
  template <class Module>
  std::vector<torch::Tensor> parameters(const Module& model) {
    return strategy_ops::parameters(models_.of(model, "ctx.parameters(model)"), detail::as_module(model));
  }

  /// `model->forward(args...)` through the Strategy: under fsdp<> the full parameters are
  /// gathered first and freed as its sharding mode says; under ddp<> it is the plain call. Use it
  /// for every forward (training and evaluation) so that one loop works with both.
  template <class Module, class... Args>
  decltype(auto) forward(Module& model, Args&&... args) {
    return strategy_ops::forward(models_.of(model, "ctx.forward(model, ...)"),
                             [&]() -> decltype(auto) { return model->forward(std::forward<Args>(args)...); });
  }

  /// The model's full parameters and buffers by name (clones), on rank 0; empty elsewhere. Under
  /// fsdp<> a collective (the shards are gathered unit by unit): call it on every rank. A model
  /// that prepare_model() did not wrap is read as it is.
  template <class Module>
  c10::Dict<std::string, at::Tensor> full_state(const Module& model) {
    return model_state(model, nullptr);
  }

  /// Bytes of model state this rank holds now: parameters and gradients (what the Strategy keeps:
  /// full copies under ddp<>, shards under fsdp<>) plus the optimizer's state tensors.
  template <class Module, class Optimizer>
  std::int64_t model_state_bytes(const Module& model, const Optimizer& optimizer) {
    const auto& s = models_.of(model, "ctx.model_state_bytes(model, optimizer)");
    return strategy_ops::held_bytes(s, detail::as_module(model)) + detail::optimizer_state_bytes(optimizer);
  }

  /// The Strategy's state of the i-th prepared model (its statistics, for instance).
  const strategy_state& strategy(std::size_t i = 0) const { return models_.at(i); }

  /// Epochs `first` .. n-1, where `first` is 0 for a fresh run and the checkpoint's epoch on
  /// resume. Iterating sets epoch(), which the Sampler draws its permutation from: no set_epoch
  /// call is needed. No epoch begins once the run is being stopped (see should_stop()).
  auto epochs(std::int64_t n) {
    core_.meter.set_epochs(n);
    const auto first = core_.cursor.first_epoch();
    return detail::epochs_until_stopped(
        first, std::max(first, n),
        [this](std::int64_t e) {
          core_.cursor.begin_epoch(e);
          core_.meter.begin_epoch(core_.steps - core_.cursor.position());
        },
        [this] { return stopping(); });
  }
  std::int64_t epoch() const { return core_.cursor.epoch(); }
  /// Ends the current epoch early (a per-epoch step cap, early stopping within an epoch): a
  /// checkpoint taken after it resumes at the next epoch, not inside this one, and the progress
  /// line counts the epochs left as this one's steps long. Call it where the loop leaves
  /// ctx.shard(...) with `break`.
  void end_epoch() {
    core_.cursor.end_epoch();
    core_.meter.end_epoch_early(core_.steps);
  }

  /// This rank's batches of `split` for the current epoch (data::batches over the Sampler's
  /// indices for this rank), global_batch / world_size samples at a time. Throws ConfigError when
  /// world_size does not divide global_batch. A shard of the Trainer's Sampler ends at the first
  /// batch boundary of the step the group agreed to stop at (see should_stop()); one of another
  /// Sampler (an evaluation) runs to its end, so that its metrics count every sample.
  ///
  /// `sampler` overrides the Trainer's Sampler for this call, as a value:
  /// `ctx.shard(test, b, dtrain::sampler::sequential{})` gives every sample exactly once across
  /// ranks, for evaluation.
  ///
  /// The position a checkpoint saves is the training shard's. Each call keeps its own position;
  /// the training shard is the one whose batch is in hand (the latest handed out) when the loop
  /// calls backward() or step(), so an evaluation or a prediction between the training loop and
  /// checkpoint(), with any Sampler, moves nothing. A checkpoint saves the training split's size
  /// too, and after a resume the first shard of the resumed epoch over a split of that size skips
  /// the batches the checkpoint's epoch had trained; other shards run whole. When the loop then
  /// trains first on another shard (an evaluation of the same size took the position), step() and
  /// backward() throw ConfigError: evaluate with sampler::sequential{}.
  template <data::RandomAccess Split, class Sampler = trainer_sampler>
  auto shard(const Split& split, std::int64_t global_batch, Sampler /*sampler*/ = {});

  /// Autocast for the forward pass while the returned scope lives (a no-op under fp32).
  auto autocast() const { return precision_.autocast(); }

  /// Backward through the Precision policy (loss scaling where it applies); under ddp<> gradients
  /// are averaged over ranks when it returns. A plain loss.backward() synchronises too.
  void backward(const torch::Tensor& loss) {
    core_.meter.on_backward(loss);
    core_.cursor.trained();
    precision_.backward(loss);
  }

  /// The optimizer step through the Precision policy; returns false when it skipped the step.
  /// A sparse gradient (an Embedding made with `.sparse(true)`) steps as the dense gradient it
  /// equals, with any optimizer (precision/dense_gradients.hpp).
  template <class Optimizer>
  bool step(Optimizer& opt) {
    const auto dense = dense_gradients_.lend(opt);  // sparse gradients step as their dense equals
    check_optimizer(opt);
    const bool stepped = precision_.step(opt);
    count_step();
    return stepped;
  }

  /// The training step captured in a CUDA graph and replayed: `forward(inputs...)` returns the
  /// loss; each `step(inputs...)` call then runs forward, backward and opt's step as one graph
  /// launch and returns the loss. For one worker on a GPU, static shapes, SGD/Adam/AdamW, fp32 or
  /// amp<bf16>; see context/graphed_step.hpp for what it captures and what it refuses.
  /// `auto step = ctx.graphed_step(opt, [&](const auto& x, const auto& y) { return loss_fn(model(x), y); });`
  template <class Optimizer, class Forward>
  auto graphed_step(Optimizer& opt, Forward forward, GraphOptions options = {}) {
    return GraphedStep<Context, Optimizer, Forward>(*this, opt, std::move(forward), options);
  }

  /// Values to record with the step history's next row (steps.jsonl, every
  /// ProgressConfig::record_every steps): a learning rate, a gradient norm, anything that changes
  /// within an epoch. Not synchronised and no collective: rank 0's values are the ones recorded,
  /// other ranks' calls cost nothing. A name given twice before the row keeps its last value.
  /// `ctx.log_step({{"lr", scheduler.lr()}});`
  void log_step(const Metrics& values) { core_.meter.log(values); }

  /// The number of optimizer steps the progress line counts towards (for its step/total and ETA),
  /// when the loop stops before ctx.epochs(n) ends (a step limit, early stopping). Without it the
  /// total is n epochs of the Trainer's Sampler's batches.
  void set_total_steps(std::int64_t total) { core_.meter.set_total_steps(total); }
  /// Optimizer steps taken through step() on this rank.
  std::int64_t steps() const { return core_.steps; }
  /// Of those, the steps the Precision policy skipped (an inf or NaN gradient under loss scaling).
  std::int64_t skipped_steps() const { return precision_ops::skipped_steps(precision_); }
  /// The Precision policy's per-worker state (amp's GradScaler, for instance).
  precision_state& precision() { return precision_; }

  /// While the returned guard lives, backward passes accumulate gradients locally without
  /// synchronising them (gradient accumulation: k-1 of every k micro-batches).
  [[nodiscard]] auto no_sync() {
    struct guard {
      PreparedModels<strategy_state>* models;
      explicit guard(PreparedModels<strategy_state>* m) : models(m) {
        models->for_each([](auto& s) { s.set_sync(false); });
      }
      guard(const guard&) = delete;
      ~guard() {
        models->for_each([](auto& s) { s.set_sync(true); });
      }
    };
    return guard{&models_};
  }

  /// Records `metrics` as one step of the run. A synchronised step: every rank must call it the
  /// same number of times; rank 0's metrics are the ones recorded. Throws WorkerError when a rank
  /// left the loop with fewer reports, or failed.
  void report(const Metrics& metrics) { record(metrics); }

  /// report(metrics) that also saves `snapshot` (from checkpoint()) as checkpoint_NNNNNN, NNNNNN
  /// being this report's iteration. Under checkpointer::directory<> (asynchronous) the files are
  /// written on a background thread; the next checkpoint() or the end of the loop waits for it.
  void report(const Metrics& metrics, checkpointer::Snapshot&& snapshot) {
    static_assert(persists, "dtrain: ctx.report(metrics, checkpoint) needs a Checkpointer that persists; "
                            "this Trainer uses checkpointer::none. Add dtrain::checkpointer::directory<> to the "
                            "Trainer's policies.");
    Metrics row = record(metrics);
    checkpoints_.save(std::move(snapshot), core_.reports, std::move(row));
    // An elastic group smaller than num_workers grows back here: every rank ends once this
    // checkpoint is complete, and the driver resumes num_workers from it (launch/elastic.hpp).
    if (launch::regrow_due(core_.group.identity(), core_.scaling, ++core_.group_checkpoints)) {
      finish();
      if (world_rank() == 0) core_.group.store().set(core_.group.key(launch::regroup_key), launch::to_bytes("1"));
      throw launch::Regroup{};
    }
  }

  /// Takes a snapshot of the model's parameters and buffers, the optimizer's state, the
  /// Precision's state (amp's GradScaler), this rank's generators and sampler position, and
  /// `extras`, for report(metrics, snapshot) to save; `.with_file(name, path)` and
  /// `.with_object(name, object)` on it add the user's files and objects. Waits
  /// for the previous checkpoint's write first. Call it on every rank (rank 0 keeps the model and
  /// optimizer state, which are replicated; every rank keeps its own generator and position).
  template <class Module, class Optimizer>
  checkpointer::Snapshot checkpoint(const Module& model, Optimizer& optimizer, Metrics extras = {});

  /// The checkpoint this group resumed from (the newest valid one of the run directory, or
  /// RunConfig::resume_from), or nothing for a fresh start. The epoch, sampler position and
  /// counters are restored already; restore the rest with ctx.restore(*ck, model, optimizer).
  std::optional<checkpointer::Checkpoint> get_checkpoint() const {
    auto c = checkpoints_.resumed();
    if (c) c->mark_for_worker([this, dir = c->path()](const std::string& why) { core_.mark_unloadable(dir, why); });
    return c;
  }

  /// Loads `ck` into a prepared model (through the Strategy: under fsdp<> each rank keeps its
  /// shard, and a ddp<> checkpoint loads into fsdp<> and back) and restores this rank's generators
  /// (CPU, and CUDA on a GPU) and the Precision's state (amp's GradScaler). The user's objects
  /// load with ck.load_object(name, object), their files are at ck.file(name).
  template <class Module>
  void restore(const checkpointer::Checkpoint& ck, Module& model) {
    auto& s = models_.of(model, "ctx.restore(checkpoint, model)");
    const auto source = (ck.path() / checkpointer::files::model).string();
    ck.check_adapter_base(detail::as_module(model));  // another base is the user's error, not a damaged file
    naming_file(ck, checkpointer::files::model, [&] {
      const auto tensors = ck.model_state();
      if (!strategy_ops::load_full_state(s, tensors, source))
        checkpointer::Checkpoint::load_tensors(detail::as_module(model), tensors, source);
    });
    naming_file(ck, checkpointer::files::rank(world_rank()), [&] { ck.restore_generator(world_rank()); });
    ck.restore_device_generator(world_rank(), core_.device);
    if constexpr (requires(precision_state& p, torch::serialize::InputArchive& a) { p.load(a); })
      naming_file(ck, checkpointer::files::precision, [&] { ck.load_precision(precision_); });
  }
  /// restore(ck, model), and the optimizer's state (this rank's piece under fsdp<>; saved by
  /// another worker count, every saved rank's piece re-cut for this one).
  template <class Module, class Optimizer>
  void restore(const checkpointer::Checkpoint& ck, Module& model, Optimizer& optimizer) {
    restore(ck, model);
    if (strategy_ops::shards_optimizer && ck.world_size() != world_size()) {
      naming_file(ck, checkpointer::files::rank_optimizer(0), [&] {
        strategy_ops::load_resharded_optimizer(models_.of(model, "ctx.restore(checkpoint, model, optimizer)"),
                                               optimizer, ck, world_size());
      });
      return;
    }
    naming_file(ck, strategy_ops::shards_optimizer ? checkpointer::files::rank_optimizer(world_rank())
                                                   : std::string(checkpointer::files::optimizer),
                [&] { ck.load_optimizer_of_rank(optimizer, world_rank(), strategy_ops::shards_optimizer); });
  }

  /// Time the training thread spent on checkpoints, and time the writes took.
  const checkpointer::CheckpointStats& checkpoint_stats() const { return checkpoints_.stats(); }

  /// Batches of the Trainer's Sampler trained so far in the current epoch (the position a
  /// checkpoint saves): not the batch in hand until the loop trains on it or takes the next.
  std::int64_t sampler_position() const { return core_.cursor.position(); }
  /// report() calls made so far on this rank.
  std::int64_t reports() const { return core_.reports; }

  /// `value` reduced over all ranks (mean, sum, max or min); every rank gets the result.
  double all_reduce(double value, reduce op = reduce::mean) {
    const auto on = backend::uses_cuda ? core_.device : torch::Device(torch::kCPU);
    torch::Tensor t = torch::full({1}, value, torch::TensorOptions().dtype(torch::kFloat64).device(on));
    comm_.allreduce(t, op).wait();
    return t.item<double>();
  }

  /// `tensor` reduced in place over all ranks (sum by default), on the device it is on; every
  /// rank gets the result (a SyncBatchNorm's statistics, a metric's tensor).
  void all_reduce(torch::Tensor& tensor, reduce op = reduce::sum) { comm_.allreduce(tensor, op).wait(); }

  /// Sums a metric's state (evaluation::ConfusionMatrix, or any type with all_reduce(communicator))
  /// over all ranks, into every rank's: an evaluation split over the ranks then gives exactly the
  /// numbers of one process. Call it on every rank, after the last update.
  template <class Metric>
    requires requires(Metric& m, communicator_type& c) { m.all_reduce(c); }
  void all_reduce(Metric& metric) {
    metric.all_reduce(comm_);
  }

  /// Records an evaluation in the run directory's evaluations.json (rank 0 writes; other ranks do
  /// nothing): `cm`'s summary (accuracy, precision, recall, F1 macro and weighted), its counts and
  /// the class names, under `name`, replacing an earlier evaluation of that name. The Tracker puts
  /// it into report.html and MLflow; Result::evaluations reads it back. All-reduce `cm` first.
  template <class Names = std::vector<std::string>>
  void record_evaluation(const std::string& name, const evaluation::ConfusionMatrix& cm, const Names& class_names = {},
                         const std::string& checkpoint = "", const Metrics& extra = {});

  /// The best checkpoint of this run so far by RunConfig::checkpoint (score_attribute and
  /// score_order; the latest when no score attribute is set), or nothing. A synchronised step:
  /// every rank waits for the checkpoint being written, then every rank gets the same answer.
  std::optional<checkpointer::Checkpoint> best_checkpoint();

  /// The backend's communicator, for collectives of your own (same order on every rank).
  communicator_type& communicator() { return comm_; }

  /// Called by the Trainer when the loop returns: checks every rank reported equally often, waits
  /// for all, and writes the metrics table. Not for the loop to call.
  void finish();

 private:
  // core_.naming_file with any callable (the file's load).
  template <class Load>
  void naming_file(const checkpointer::Checkpoint& ck, const std::string& file, Load&& load) {
    core_.naming_file(ck, file, std::function<void()>(std::forward<Load>(load)));
  }

  // full_state(model); where the strategy leaves the model whole, rank 0 copies it into `into`
  // (checkpoint(): the previous snapshot's buffers) instead of cloning it.
  template <class Module>
  c10::Dict<std::string, at::Tensor> model_state(const Module& model, checkpointer::detail::SnapshotBuffers* into) {
    if (auto* s = models_.find(model)) return strategy_ops::full_state(*s, detail::as_module(model), world_rank(), into);
    return strategy_ops::whole_state(detail::as_module(model), world_rank(), into);
  }

  // Under fsdp<> an optimizer over the model's own parameters would step tensors whose gradients
  // are never kept: refuse it loudly. And a first step with no gradient at all (no backward ran)
  // gets a warning. Checked once per optimizer, not every step.
  template <class Optimizer>
  void check_optimizer(const Optimizer& opt);

  // The synchronised part of report(): the barrier, and rank 0's row appended to the history.
  Metrics record(const Metrics& metrics);

  void count_step() { core_.count_step(); }
  // A step that GraphedStep replayed: what backward() and step() count, without their work.
  template <class, class, class>
  friend class GraphedStep;
  void count_replayed_step(const torch::Tensor& loss) {
    core_.meter.on_backward(loss);
    count_step();
  }

  bool stopping() { return core_.stopping(); }

  detail::ContextCore core_;  // first: the policies' states below are built over its group
  communicator_type comm_;
  precision_state precision_;
  precision::dense_gradients dense_gradients_;
  PreparedModels<strategy_state> models_;
  checkpointer_state checkpoints_;
};

DTRAIN_NAMESPACE_END

#include <dtrain/context/context_impl.hpp>
