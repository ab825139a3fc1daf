#pragma once
// The worker context: what the train loop gets, once per rank.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <range/v3/view/iota.hpp>
#include <range/v3/view/transform.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/nn/module.h>
#include <torch/types.h>

#include <dtrain/backend/gloo.hpp>
#include <dtrain/checkpointer/checkpoint.hpp>
#include <dtrain/checkpointer/directory.hpp>
#include <dtrain/concept/backend.hpp>
#include <dtrain/concept/precision.hpp>
#include <dtrain/concept/strategy.hpp>
#include <dtrain/config.hpp>
#include <dtrain/data/dataset.hpp>
#include <dtrain/data/prefetch.hpp>
#include <dtrain/data/shard.hpp>
#include <dtrain/detail/memory.hpp>
#include <dtrain/error.hpp>
#include <dtrain/evaluation/classification.hpp>
#include <dtrain/launch/environment.hpp>
#include <dtrain/launch/rendezvous.hpp>
#include <dtrain/metrics.hpp>
#include <dtrain/result.hpp>
#include <dtrain/tracking/progress.hpp>
#include <dtrain/tracking/record.hpp>

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
  using backend_traits_type = dtrain::backend_traits<backend>;
  using strategy_traits_type = dtrain::strategy_traits<typename Policies::strategy>;
  using precision_traits_type = dtrain::precision_traits<typename Policies::precision>;
  static constexpr bool persists = Policies::checkpointer::persists;
  // Strategies whose optimizer steps this rank's shards (fsdp<>): each rank checkpoints its own.
  static constexpr bool sharded_optimizer = strategy_traits_type::shards_optimizer;
  static constexpr bool async_writes = [] {
    if constexpr (requires { Policies::checkpointer::asynchronous; }) return bool(Policies::checkpointer::asynchronous);
    else return false;
  }();

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
        precision_(make_precision(device_, comm_)),
        progress_(run.progress, who.rank == 0) {
    backend_traits_type::on_stall(comm_, [this] { check_peers("a collective", false); });
    if (who_.rank == 0) std::filesystem::create_directories(run_.path());
    if constexpr (persists) {
      find_resume_point();
    } else if (who_.rank == 0) {
      std::filesystem::remove(history_path());  // a fresh group starts a fresh history
    }
  }

  ~Context() {
    // A write still running after an error: rank 0's stops waiting for the other ranks' files.
    abort_ = true;
    if (pending_.valid()) pending_.wait();
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
  /// How many times the driver restarted the group before this one (0 for the first group).
  int attempt() const { return who_.attempt; }
  /// @}

  /// Moves the model to this worker's device and wraps it with the Strategy (for ddp<>: rank 0's
  /// weights broadcast, gradient hooks installed; for fsdp<>: parameters sharded, see
  /// strategy/fsdp.hpp). Returns the same handle; the wrapping lives as long as this context. Call
  /// it once per model, on every rank, in the same order.
  template <detail::ModuleHandle Module>
  Module prepare_model(Module model) {
    model->to(device_);
    auto& m = static_cast<torch::nn::Module&>(*model);
    strategies_.push_back(std::make_unique<strategy_state>(m, comm_));
    prepared_.push_back(&m);
    return model;
  }

  /// The tensors to build the optimizer over: the model's parameters under ddp<>, this rank's
  /// flat shards under fsdp<> (so the optimizer's state is 1/N too). One line for both:
  /// `torch::optim::Adam opt(ctx.parameters(model), 1e-3);`
  template <class Module>
  std::vector<torch::Tensor> parameters(const Module& model) {
    auto& s = strategy_of(model, "ctx.parameters(model)");
    return strategy_traits_type::parameters(s, as_module(model));
  }

  /// `model->forward(args...)` through the Strategy: under fsdp<> the full parameters are
  /// gathered first and freed as its sharding mode says; under ddp<> it is the plain call. Use it
  /// for every forward (training and evaluation) so that one loop works with both.
  template <class Module, class... Args>
  decltype(auto) forward(Module& model, Args&&... args) {
    auto& s = strategy_of(model, "ctx.forward(model, ...)");
    return strategy_traits_type::forward(s, [&]() -> decltype(auto) { return model->forward(std::forward<Args>(args)...); });
  }

  /// The model's full parameters and buffers by name (clones), on rank 0; empty elsewhere. Under
  /// fsdp<> a collective (the shards are gathered unit by unit): call it on every rank. A model
  /// that prepare_model() did not wrap is read as it is.
  template <class Module>
  c10::Dict<std::string, at::Tensor> full_state(const Module& model) {
    if (auto* s = find_strategy(model)) return strategy_traits_type::full_state(*s, as_module(model), who_.rank);
    if (who_.rank == 0) return checkpointer::detail::named_state(as_module(model), true);
    return c10::Dict<std::string, at::Tensor>();
  }

  /// Bytes of model state this rank holds now: parameters and gradients (what the Strategy keeps:
  /// full copies under ddp<>, shards under fsdp<>) plus the optimizer's state tensors.
  template <class Module, class Optimizer>
  std::int64_t model_state_bytes(const Module& model, const Optimizer& optimizer) {
    auto& s = strategy_of(model, "ctx.model_state_bytes(model, optimizer)");
    return detail::optimizer_state_bytes(optimizer) + strategy_traits_type::held_bytes(s, as_module(model));
  }

  /// The Strategy's state of the i-th prepared model (its statistics, for instance).
  const strategy_state& strategy(std::size_t i = 0) const { return *strategies_.at(i); }

  /// Epochs `first` .. n-1, where `first` is 0 for a fresh run and the checkpoint's epoch on
  /// resume. Iterating sets epoch(), which the Sampler draws its permutation from: no set_epoch
  /// call is needed.
  auto epochs(std::int64_t n) {
    epochs_total_ = n;
    return ranges::views::iota(first_epoch_, std::max(first_epoch_, n)) |
           ranges::views::transform([this](std::int64_t e) {
             epoch_ = e;
             epoch_batches_ = 0;
             if (skip_pending_ && e == first_epoch_) {
               position_ = resume_position_;
             } else {
               skip_pending_ = false;
               position_ = 0;
             }
             return e;
           });
  }
  std::int64_t epoch() const { return epoch_; }

  /// This rank's batches of `split` for the current epoch: the Sampler's indices for this rank,
  /// global_batch / world_size samples at a time. Throws ConfigError when world_size does not
  /// divide global_batch.
  /// `Sampler` overrides the Trainer's for this call: ctx.shard<sampler::sequential>(test, b) gives
  /// every sample exactly once across ranks, for evaluation.
  ///
  /// With the Trainer's Sampler the context counts the batches produced in the current epoch (the
  /// sampler position a checkpoint saves); the first such shard after a resume skips the batches
  /// the checkpoint's epoch had consumed already. Shards with another Sampler are not counted.
  template <class Sampler = typename Policies::sampler, data::RandomAccess Split>
  auto shard(const Split& split, std::int64_t global_batch) const {
    if (global_batch < 1 || global_batch % who_.world_size != 0)
      throw ConfigError("global batch " + std::to_string(global_batch) + " does not divide evenly among " +
                        std::to_string(who_.world_size) + " workers; choose a global batch that is a " +
                        "multiple of the worker count (e.g. " +
                        std::to_string(std::max<std::int64_t>(1, global_batch / who_.world_size) * who_.world_size) + ")");
    const std::int64_t batch_size = global_batch / who_.world_size;
    auto order = std::make_shared<const std::vector<std::int64_t>>(
        Sampler::indices(static_cast<std::int64_t>(split.size()), who_.rank, who_.world_size, epoch_));
    const auto count = static_cast<std::int64_t>(order->size());
    const std::int64_t n_batches = (count + batch_size - 1) / batch_size;
    std::int64_t skip = 0;
    std::int64_t* position = nullptr;
    std::int64_t* samples = nullptr;
    const std::int64_t world = who_.world_size;
    if constexpr (std::is_same_v<Sampler, typename Policies::sampler>) {
      position = &position_;
      samples = &samples_;
      epoch_batches_ = n_batches;
      if (skip_pending_) skip = std::min(position_, n_batches);
      else position_ = 0;
      skip_pending_ = false;
    }
    auto batches = [&split, order, batch_size, count, skip, n_batches, samples, world](std::int64_t* position) {
      return ranges::views::iota(skip, n_batches) |
             ranges::views::transform([&split, order, batch_size, count, position, samples, world](std::int64_t b) -> data::Batch {
               if (position) *position = b + 1;
               const std::int64_t begin = b * batch_size, len = std::min(batch_size, count - begin);
               if (samples) *samples += len * world;  // the group's samples, for the progress line
               // from_blob does not copy; index_select reads it before `order` can go away.
               const auto idx = torch::from_blob(const_cast<std::int64_t*>(order->data() + begin), {len}, torch::kInt64);
               return split.get_batch(idx);
             });
    };
    if constexpr (backend_traits_type::has_batch_transfer) {
      // On a GPU backend the next batch moves to the device while this one trains; the position
      // counts the batches handed to the loop, not the one read ahead.
      std::function<void()> on_yield;
      if (position) on_yield = [position, next = skip]() mutable { *position = ++next; };
      return data::prefetch(batches(nullptr), typename backend::batch_transfer(device_), std::move(on_yield));
    } else {
      return batches(position);
    }
  }

  /// Autocast for the forward pass while the returned scope lives (a no-op under fp32).
  auto autocast() const { return precision_.autocast(); }

  /// Backward through the Precision policy (loss scaling where it applies); under ddp<> gradients
  /// are averaged over ranks when it returns. A plain loss.backward() synchronises too.
  void backward(const torch::Tensor& loss) {
    if (progress_.enabled()) last_loss_ = loss.detach();  // read only when a progress line is drawn
    precision_.backward(loss);
  }

  /// The optimizer step through the Precision policy; returns false when it skipped the step.
  template <class Optimizer>
  bool step(Optimizer& opt) {
    check_optimizer(opt);
    const bool stepped = precision_.step(opt);
    if (first_step_ == std::chrono::steady_clock::time_point{}) {
      first_step_ = std::chrono::steady_clock::now();
      steps_at_first_ = steps_;
      samples_at_first_ = samples_;
    }
    ++steps_;
    if (steps_ - steps_at_first_ >= 2 && progress_.due()) draw_progress();  // rates need two steps
    return stepped;
  }

  /// The number of optimizer steps the progress line counts towards (for its step/total and ETA),
  /// when the loop stops before ctx.epochs(n) ends (a step limit, early stopping). Without it the
  /// total is n epochs of the Trainer's Sampler's batches.
  void set_total_steps(std::int64_t total) { total_steps_ = total; }
  /// Optimizer steps taken through step() on this rank.
  std::int64_t steps() const { return steps_; }
  /// Of those, the steps the Precision policy skipped (an inf or NaN gradient under loss scaling).
  std::int64_t skipped_steps() const {
    return precision_traits_type::skipped_steps(precision_);
  }
  /// The Precision policy's per-worker state (amp's GradScaler, for instance).
  precision_state& precision() { return precision_; }

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
  void report(const Metrics& metrics) { record(metrics); }

  /// report(metrics) that also saves `snapshot` (from checkpoint()) as checkpoint_NNNNNN, NNNNNN
  /// being this report's iteration. Under checkpointer::directory<> (asynchronous) the files are
  /// written on a background thread; the next checkpoint() or the end of the loop waits for it.
  void report(const Metrics& metrics, checkpointer::Snapshot&& snapshot) {
    static_assert(persists,
                  "dtrain: ctx.report(metrics, checkpoint) needs a Checkpointer that persists; this "
                  "Trainer uses checkpointer::none. Add dtrain::checkpointer::directory<> to the "
                  "Trainer's policies.");
    Metrics row = record(metrics);
    const auto t0 = std::chrono::steady_clock::now();
    start_write(std::move(snapshot), reports_, std::move(row));
    stats_.blocked_s += seconds_since(t0);
  }

  /// Takes a snapshot of the model's parameters and buffers, the optimizer's state, this rank's
  /// generator and sampler position, and `extras`, for report(metrics, snapshot) to save. Waits
  /// for the previous checkpoint's write first. Call it on every rank (rank 0 keeps the model and
  /// optimizer state, which are replicated; every rank keeps its own generator and position).
  template <class Module, class Optimizer>
  checkpointer::Snapshot checkpoint(const Module& model, Optimizer& optimizer, Metrics extras = {}) {
    static_assert(persists,
                  "dtrain: ctx.checkpoint(model, optimizer) needs a Checkpointer that persists; this "
                  "Trainer uses checkpointer::none. Add dtrain::checkpointer::directory<> to the "
                  "Trainer's policies.");
    const auto t0 = std::chrono::steady_clock::now();
    wait_for_write();
    checkpointer::Snapshot s;
    s.model = full_state(model);
    s.has_model = who_.rank == 0;
    if constexpr (sharded_optimizer) {
      check_optimizer(optimizer);
      s.optimizer = checkpointer::detail::optimizer_bytes(optimizer);
      s.sharded_optimizer = true;
    } else if (who_.rank == 0) {
      s.optimizer = checkpointer::detail::optimizer_bytes(optimizer);
    }
    s.extras = std::move(extras);
    s.generator = checkpointer::detail::default_generator_state();
    // A checkpoint after an epoch's last batch resumes at the next epoch's first.
    if (epoch_batches_ > 0 && position_ >= epoch_batches_) {
      s.epoch = epoch_ + 1;
      s.position = 0;
    } else {
      s.epoch = epoch_;
      s.position = position_;
    }
    s.steps = steps_;
    stats_.blocked_s += seconds_since(t0);
    return s;
  }

  /// The checkpoint this group resumed from (the newest valid one of the run directory, or
  /// RunConfig::resume_from), or nothing for a fresh start. Its restore(model, optimizer) loads
  /// both and this rank's generator; the epoch, sampler position and counters are restored already.
  /// Under fsdp<> its load_model(model) loads the full tensors into this rank's shards (a ddp<>
  /// checkpoint loads into fsdp<> and back), and its optimizer state is this rank's piece.
  std::optional<checkpointer::Checkpoint> get_checkpoint() {
    auto c = resumed_;
    if (c) attach(*c);
    return c;
  }

  /// Makes `ck` (a Checkpoint from anywhere, e.g. Result::best_checkpoint()'s path opened with
  /// Checkpoint::open) load through this context's Strategy: ck.load_model(model) then works for
  /// models prepared by ctx.prepare_model under ddp<> and fsdp<> alike.
  void attach(checkpointer::Checkpoint& ck) {
    ck.set_rank(who_.rank);
    ck.set_sharded_optimizer(sharded_optimizer);
    // false (the Strategy leaves the model whole, or the model is not prepared here): the
    // checkpoint copies the tensors into the module itself.
    ck.set_model_loader([this](torch::nn::Module& m, const std::map<std::string, torch::Tensor>& state,
                               const std::string& source) {
      for (std::size_t i = 0; i < prepared_.size(); ++i)
        if (prepared_[i] == &m) return strategy_traits_type::load_full_state(*strategies_[i], state, source);
      return false;
    });
  }

  /// Time the training thread spent on checkpoints, and time the writes took.
  const checkpointer::CheckpointStats& checkpoint_stats() const { return stats_; }

  /// Batches of the Trainer's Sampler produced so far in the current epoch (the position a
  /// checkpoint saves).
  std::int64_t sampler_position() const { return position_; }
  /// report() calls made so far on this rank.
  std::int64_t reports() const { return reports_; }

  /// `value` reduced over all ranks (mean, sum, max or min); every rank gets the result.
  double all_reduce(double value, reduce op = reduce::mean) {
    torch::Tensor t = torch::full({1}, value, torch::TensorOptions().dtype(torch::kFloat64).device(comm_device()));
    comm_.allreduce(t, op).wait();
    return t.item<double>();
  }

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
                         const std::string& checkpoint = "", const Metrics& extra = {}) {
    if (who_.rank != 0) return;
    Metrics metrics = cm.summary();
    for (const auto& [k, v] : extra) metrics.insert_or_assign(k, v);
    std::vector<std::string> names;
    for (const auto& n : class_names) names.emplace_back(n);
    tracking::record_evaluation(run_.path(), tracking::evaluation_json(name, metrics, names, cm.counts_table(),
                                                                       checkpoint, detail::unix_now()));
    if (progress_.verbose()) progress_.note("evaluation " + name + ": " + metrics_line(metrics));
  }

  /// The best checkpoint of this run so far by RunConfig::checkpoint (score_attribute and
  /// score_order; the latest when no score attribute is set), or nothing. A synchronised step:
  /// every rank waits for the checkpoint being written, then every rank gets the same answer.
  std::optional<checkpointer::Checkpoint> best_checkpoint() {
    static_assert(persists,
                  "dtrain: ctx.best_checkpoint() needs a Checkpointer that persists; this Trainer uses "
                  "checkpointer::none. Add dtrain::checkpointer::directory<> to the Trainer's policies.");
    wait_for_write();
    ++syncs_;
    arrive("best_checkpoint/" + std::to_string(syncs_), "best_checkpoint() call " + std::to_string(syncs_));
    return checkpointer::best_valid(run_.path(), run_.checkpoint);
  }

  /// The backend's communicator, for collectives of your own (same order on every rank).
  communicator_type& communicator() { return comm_; }

  /// Called by the Trainer when the loop returns: checks every rank reported equally often, waits
  /// for all, and writes the metrics table. Not for the loop to call.
  void finish() {
    if (progress_.enabled() && steps_ > steps_at_first_) draw_progress();  // the final count
    progress_.close();
    if constexpr (persists) wait_for_write();
    // A GPU backend's collectives complete on the device: surface their errors before finishing.
    backend_traits_type::synchronize(comm_);
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
    if (persists && who_.rank == 0) {
      std::ofstream out(run_.path() / checkpointer::stats_file, std::ios::trunc);
      out << nlohmann::json(stats_).dump() << '\n';
    }
  }

  std::filesystem::path history_path() const { return run_.path() / "metrics.jsonl"; }

 private:
  template <class M>
  static torch::nn::Module& as_module(const M& m) {
    if constexpr (std::is_base_of_v<torch::nn::Module, M>) return const_cast<M&>(m);
    else return const_cast<torch::nn::Module&>(static_cast<const torch::nn::Module&>(*m));
  }

  // The Strategy state of a model prepare_model() returned; nullptr (find_) or ConfigError (of)
  // for any other.
  template <class M>
  strategy_state* find_strategy(const M& model) {
    const torch::nn::Module* m = &as_module(model);
    for (std::size_t i = 0; i < prepared_.size(); ++i)
      if (prepared_[i] == m) return strategies_[i].get();
    return nullptr;
  }
  template <class M>
  strategy_state& strategy_of(const M& model, const char* call) {
    if (auto* s = find_strategy(model)) return *s;
    throw ConfigError(std::string(call) + ": this model was not prepared by this context; pass the handle "
                      "returned by ctx.prepare_model(...)");
  }

  // Under fsdp<> an optimizer over the model's own parameters would step tensors whose gradients
  // are never kept: refuse it loudly.
  // Checked once per optimizer (and again when its parameter groups change), not every step.
  template <class Optimizer>
  void check_optimizer(const Optimizer& opt) {
    const std::pair<const void*, std::size_t> seen{&opt, opt.param_groups().size()};
    if (seen == checked_optimizer_) return;
    std::vector<torch::Tensor> params;
    for (const auto& g : opt.param_groups())
      for (const auto& p : g.params()) params.push_back(p);
    for (auto& s : strategies_) strategy_traits_type::check_optimizer(*s, params);
    checked_optimizer_ = seen;
  }
  // A precision state that can use the communicator (amp's GradScaler agrees on overflows over
  // ranks) gets it.
  static precision_state make_precision(torch::Device device, communicator_type& comm) {
    return precision_traits_type::make_state(device, comm);
  }
  // Where the backend's collectives take their tensors.
  torch::Device comm_device() const { return backend::uses_cuda ? device_ : torch::Device(torch::kCPU); }

  static double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  // The synchronised part of report(): the barrier, and rank 0's row appended to the history.
  Metrics record(const Metrics& metrics) {
    ++reports_;
    arrive("report/" + std::to_string(reports_), "report() call " + std::to_string(reports_));
    Metrics row = metrics;
    row.try_emplace("iteration", reports_);
    row.try_emplace("epoch", epoch_);
    row.try_emplace("step", steps_);
    row.try_emplace("timestamp", detail::unix_now());
    if constexpr (precision_traits_type::loss_scaling) {
      row.try_emplace("skipped_steps", precision_traits_type::skipped_steps(precision_));
      row.try_emplace("loss_scale", precision_traits_type::loss_scale(precision_));
    }
    if (who_.rank == 0) MetricsHistory::append_jsonl(history_path(), row);
    if (progress_.verbose()) progress_.note("report " + std::to_string(reports_) + ": " + metrics_line(metrics));
    return row;
  }

  static std::string metrics_line(const Metrics& metrics) {
    std::string line;
    for (const auto& [k, v] : metrics) {
      if (!line.empty()) line += ", ";
      line += k + "=";
      if (v.is_number() && !v.is_integer()) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.5g", v.number());
        line += buf;
      } else {
        line += v.text();
      }
    }
    return line;
  }

  // Rank 0's progress line: rates over this group's steps since its first one.
  void draw_progress() {
    tracking::ProgressSnapshot p;
    p.epoch = epoch_;
    p.epochs = epochs_total_;
    p.step = steps_;
    p.total_steps = total_steps_ > 0 ? total_steps_ : epochs_total_ * epoch_batches_;
    const double elapsed = seconds_since(first_step_);
    if (elapsed > 0) {
      p.steps_per_s = static_cast<double>(steps_ - steps_at_first_) / elapsed;
      p.samples_per_s = static_cast<double>(samples_ - samples_at_first_) / elapsed;
    }
    if (last_loss_.defined()) p.loss = last_loss_.template item<double>();
    progress_.draw(p);
  }

  // Rank 0 picks the checkpoint to resume from (warning about damaged ones), removes leftover
  // temporary directories and cuts the history back to the checkpoint; every rank then restores
  // its counters and sampler position from it.
  void find_resume_point() {
    namespace fs = std::filesystem;
    const auto k = launch::key(who_.attempt, "checkpoint/resume");
    if (who_.rank == 0) {
      std::string answer;
      try {
        std::error_code ec;
        for (const auto& e : fs::directory_iterator(run_.path(), ec))
          if (e.path().filename().string().rfind(".tmp_checkpoint_", 0) == 0) fs::remove_all(e.path(), ec);
        auto ck = checkpointer::latest_valid(run_.path());
        if (!ck && run_.resume_from) {
          std::string why;
          ck = checkpointer::Checkpoint::open(*run_.resume_from, &why);
          if (!ck)
            throw ConfigError("RunConfig::resume_from " + run_.resume_from->string() +
                              " cannot be resumed from: " + why + "; and " + run_.path().string() +
                              " holds no valid checkpoint either. Point resume_from at a "
                              "checkpoint_NNNNNN directory whose manifest verifies, or unset it to "
                              "start afresh.");
        }
        MetricsHistory kept;
        if (ck) {
          const auto history = MetricsHistory::read_jsonl(history_path());
          for (const auto& row : history.rows()) {
            auto it = row.find("iteration");
            if (it != row.end() && it->second.is_number() && it->second.number() <= static_cast<double>(ck->iteration()))
              kept.push_back(row);
          }
          for (const auto& [iteration, dir] : checkpointer::list(run_.path()))
            if (iteration <= ck->iteration())
              if (auto c = checkpointer::Checkpoint::open(dir, nullptr, false))
                index_.insert(index_.begin(), {iteration, dir, c->metrics()});
          answer = ck->path().string();
        }
        const auto tmp = history_path().string() + ".tmp";
        fs::remove(tmp);
        for (const auto& row : kept.rows()) MetricsHistory::append_jsonl(tmp, row);
        if (kept.empty()) fs::remove(history_path());
        else fs::rename(tmp, history_path());
      } catch (const std::exception& e) {
        store_->set(k, launch::to_bytes(std::string("!") + e.what()));
        throw;
      }
      store_->set(k, launch::to_bytes(answer));
    }
    const auto answer = launch::to_string(store_->get(k));
    if (!answer.empty() && answer[0] == '!')
      throw ConfigError("rank 0 could not choose a checkpoint to resume from: " + answer.substr(1));
    if (answer.empty()) return;
    resumed_ = checkpointer::Checkpoint::open(answer, nullptr, /*verify_files=*/false);  // rank 0 did
    if (!resumed_) throw Error(answer + ": the checkpoint rank 0 chose cannot be opened on rank " + std::to_string(who_.rank));
    resumed_->set_rank(who_.rank);
    steps_ = resumed_->steps();
    reports_ = resumed_->iteration();
    first_epoch_ = epoch_ = resumed_->epoch();
    if (auto s = resumed_->sampler_state(who_.rank)) {
      first_epoch_ = epoch_ = s->first;
      resume_position_ = position_ = s->second;
    }
    skip_pending_ = resume_position_ > 0;
  }

  void wait_for_write() {
    if (!pending_.valid()) return;
    const double took = pending_.get();  // rethrows what the write threw
    stats_.write_s += took;
    stats_.last_write_s = took;
    ++stats_.written;
  }

  // Writes checkpoint `iteration`: every rank its own file, rank 0 the rest, the manifest and the
  // rename once every rank's file is there. On a background thread under directory<true>.
  void start_write(checkpointer::Snapshot&& snapshot, std::int64_t iteration, Metrics reported) {
    const bool crash = who_.rank == 0 && who_.attempt == 0 && checkpointer::detail::fault_iteration() == iteration;
    auto work = [this, s = std::move(snapshot), iteration, reported = std::move(reported), crash]() -> double {
      const auto t0 = std::chrono::steady_clock::now();
      const auto tmp = run_.path() / checkpointer::temporary_name(iteration);
      std::filesystem::create_directories(tmp);
      checkpointer::detail::write_rank_file(tmp, who_.rank, s);
      const auto written = launch::key(who_.attempt, "checkpoint/" + std::to_string(iteration) + "/written");
      store_->add(written, 1);
      if (who_.rank != 0) return seconds_since(t0);
      auto wait_for_ranks = [&] {
        const auto deadline = std::chrono::steady_clock::now() + run_.collective_timeout;
        while (store_->add(written, 0) < who_.world_size) {
          if (abort_) return false;
          if (std::chrono::steady_clock::now() > deadline)
            throw WorkerError("rank 0 waited " + std::to_string(run_.collective_timeout.count()) +
                              " ms for the other ranks' files of " + tmp.string());
          std::this_thread::sleep_for(std::chrono::milliseconds(2));
        }
        return true;
      };
      const auto dest = checkpointer::detail::commit(run_.path(), iteration, who_.world_size, s, reported, crash,
                                                     wait_for_ranks);
      if (dest.empty()) return seconds_since(t0);
      index_.push_back({iteration, dest, reported});
      checkpointer::retain(index_, run_.checkpoint);
      return seconds_since(t0);
    };
    if constexpr (async_writes) {
      pending_ = std::async(std::launch::async, std::move(work));
    } else {
      std::promise<double> done;
      done.set_value(work());
      pending_ = done.get_future();
    }
  }

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
  std::vector<const torch::nn::Module*> prepared_;  // the module of each strategies_ entry
  std::pair<const void*, std::size_t> checked_optimizer_{nullptr, 0};  // see check_optimizer
  std::int64_t epoch_ = 0, steps_ = 0, reports_ = 0;
  // Resume and sampler position (see shard()).
  std::optional<checkpointer::Checkpoint> resumed_;
  std::int64_t first_epoch_ = 0, resume_position_ = 0;
  mutable std::int64_t position_ = 0, epoch_batches_ = 0;
  mutable bool skip_pending_ = false;
  // Checkpoint writing: at most one write in flight.
  std::future<double> pending_;
  std::atomic<bool> abort_{false};
  checkpointer::CheckpointStats stats_;
  std::vector<checkpointer::Entry> index_;  // rank 0: the checkpoints retention knows
  // Progress (rank 0) and the counts it shows.
  tracking::Progress progress_;
  torch::Tensor last_loss_;
  std::int64_t epochs_total_ = 0, total_steps_ = 0, steps_at_first_ = 0, samples_at_first_ = 0, syncs_ = 0;
  mutable std::int64_t samples_ = 0;
  std::chrono::steady_clock::time_point first_step_{};
};

DTRAIN_NAMESPACE_END
