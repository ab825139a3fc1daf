// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of Context's larger members (context.hpp holds the class, readable on one screen).

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include <dtrain/context.hpp>
#include <dtrain/progress_mark.hpp>

DTRAIN_NAMESPACE_BEGIN

template <class Policies>
Context<Policies>::Context(const launch::WorkerIdentity& who, c10::intrusive_ptr<c10d::Store> store, const ScalingConfig& scaling,
        const RunConfig& run)
    : group_(who, std::move(store), run.collective_timeout, run.failure.heartbeat_timeout, run.failure.progress_timeout),
      scaling_(scaling),
      run_(run),
      dir_(run.path()),
      device_(backend::device(who.local_rank)),
      comm_(c10::make_intrusive<c10d::PrefixStore>(group_.key("pg"), group_.store_ptr()), who, run.collective_timeout),
      precision_(precision_ops::make_state(device_, comm_)),
      meter_(run.progress, who.rank == 0, 2, std::nullopt,
             who.rank == 0 ? tracking::StepHistory(dir_.step_history(), run.progress.record_every)
                           : tracking::StepHistory()),
      checkpoints_(group_, run),
      stop_(group_, run.failure.stop_poll) {
  backend_traits<backend>::on_stall(comm_, [this] { group_.check_peers("a collective"); });
  if (who.rank == 0) dir_.create();
  std::int64_t kept = 0;  // history rows a resumed run keeps
  if (const auto& ck = checkpoints_.resumed()) {
    steps_ = ck->steps();
    reports_ = kept = ck->iteration();
    // Another worker count continues the epoch from its global sample offset, which a Sampler
    // with indices_from (sampler::distributed<>) deals to the new ranks; any other Sampler, or a
    // checkpoint that saved no offset, resumes exactly only at an epoch boundary. (A rank the
    // checkpoint had no file for would skip nothing while the others skip: a hang.)
    const bool same_world = ck->world_size() == who.world_size;
    constexpr bool deals_from_offset = ElasticSampler<trainer_sampler>;
    if (!same_world && !(deals_from_offset && ck->sample_offset(0))) {
      std::int64_t mid_epoch = 0;
      for (int r = 0; r < ck->world_size(); ++r)
        if (const auto p = ck->sampler_state(r); p && p->second > 0) mid_epoch = p->second;
      if (mid_epoch > 0)
        throw ConfigError(ck->path().string() + " was written by " + std::to_string(ck->world_size()) +
                          " workers " + std::to_string(mid_epoch) + " batches into epoch " +
                          std::to_string(ck->epoch()) + "; a run of " + std::to_string(who.world_size) +
                          " workers cannot continue that epoch exactly (" +
                          (deals_from_offset ? "the checkpoint saved no global sample offset"
                                             : "the Trainer's Sampler has no indices_from(offset, ...), as "
                                               "sampler::distributed<> has") +
                          "). Resume it with ScalingConfig::num_workers = " + std::to_string(ck->world_size()) +
                          " (a checkpoint at an epoch's end resumes with any count)");
    }
    // Under another worker count every rank resumes where rank 0 did: the epoch's offset is global.
    const int from = same_world ? who.rank : 0;
    const auto position = ck->sampler_state(from);
    cursor_.resume(position ? position->first : ck->epoch(), position ? position->second : 0,
                   ck->sample_offset(from).value_or(-1), !same_world);
  }
  if (who.rank == 0) {
    MetricsHistory::truncate_jsonl(dir_.history(), "iteration", kept);
    meter_.history().group_started(steps_, cursor_.epoch(), who.attempt, who.world_size);
  }
  stop_.start_counting_at(steps_);
  timing_.start(checkpoints_.resumed() ? checkpoints_.resumed()->metrics() : Metrics{});
  mark_progress("the start of the train loop");  // FailureConfig::progress_timeout counts from here
}

template <class Policies>
template <data::RandomAccess Split, class Sampler>
auto Context<Policies>::shard(const Split& split, std::int64_t global_batch, Sampler) {
  static_assert(SamplerPolicy<Sampler>,
                "dtrain: ctx.shard(split, global_batch, sampler): the third argument must be a Sampler "
                "policy value, such as dtrain::sampler::sequential{}");
  const int world = world_size();
  if (global_batch < 1 || global_batch % world != 0)
    throw ConfigError("global batch " + std::to_string(global_batch) + " does not divide evenly among " +
                      std::to_string(world) + " workers; choose a global batch that is a multiple of the worker " +
                      "count (e.g. " + std::to_string(std::max<std::int64_t>(1, global_batch / world) * world) + ")");
  const std::int64_t batch_size = global_batch / world;
  constexpr bool counted = std::is_same_v<Sampler, trainer_sampler>;
  const auto n = static_cast<std::int64_t>(split.size());
  // A resumed epoch that continues from its global sample offset (another worker count): the
  // rest of it, dealt to this group's ranks.
  std::optional<std::int64_t> offset;
  if constexpr (counted) offset = cursor_.continue_from(global_batch);
  auto order = [&] {
    // A run-time seed (RunConfig::seed, else enable_reproducibility's) replaces the Sampler's own.
    if constexpr (counted && SeededSampler<Sampler>)
      if (const auto seed = run_.seed ? run_.seed : sampler::process_seed()) {
        if constexpr (requires { Sampler::indices_from(0, 0, 0, 1, 0, *seed); })
          if (offset) return Sampler::indices_from(*offset, n, world_rank(), world, cursor_.epoch(), *seed);
        return Sampler::indices(n, world_rank(), world, cursor_.epoch(), *seed);
      }
    if constexpr (ElasticSampler<Sampler>)
      if (offset) return Sampler::indices_from(*offset, n, world_rank(), world, cursor_.epoch());
    return Sampler::indices(n, world_rank(), world, cursor_.epoch());
  }();
  std::int64_t first = 0;
  if constexpr (counted) first = cursor_.begin_shard(data::batch_count(static_cast<std::int64_t>(order.size()), batch_size));
  constexpr bool prefetching = backend_traits<backend>::has_batch_transfer;
  // Each batch is a sign of progress (FailureConfig::progress_timeout), of any shard.
  data::BatchObserver observe = [](std::int64_t b, std::int64_t) { mark_progress("batch # of an epoch (ctx.shard)", b); };
  if constexpr (counted)
    observe = [this, world](std::int64_t b, std::int64_t len) {
      mark_progress("batch # of an epoch (ctx.shard)", b);
      if (!prefetching) cursor_.reached(b);  // prefetching counts batches handed out instead
      meter_.add_samples(len * world);
      timing_.add_samples(len);
    };
  auto view = data::batches(split, std::move(order), batch_size, first, std::move(observe), cursor_.epoch());
  // The Trainer's Sampler's batches end at the step the group agreed to stop at (every rank asks
  // at every boundary, with the same step count): a loop stops without asking should_stop().
  auto until_stop = [this](auto batches) {
    if constexpr (counted)
      return detail::until_stopped<decltype(batches)>(std::move(batches), [this] { return stopping(); });
    else
      return batches;
  };
  if constexpr (prefetching) {
    // On a GPU backend the next batch moves to the device while this one trains; the position
    // counts the batches handed to the loop, not the one read ahead.
    std::function<void()> on_yield;
    if constexpr (counted) on_yield = [this, next = first]() mutable { cursor_.reached(next++); };
    return until_stop(data::prefetch(std::move(view), typename backend::batch_transfer(device_), std::move(on_yield)));
  } else {
    return until_stop(std::move(view));
  }
}

template <class Policies>
template <class Load>
void Context<Policies>::naming_file(const checkpointer::Checkpoint& ck, const std::string& file, Load&& load) {
  try {
    load();
  } catch (const ConfigError&) {
    throw;
  } catch (const std::exception& e) {
    std::string why = e.what();
    why = why.substr(0, why.find('\n'));  // LibTorch appends a backtrace
    if (!dynamic_cast<const Error*>(&e))
      why = (ck.path() / file).string() + ": cannot be loaded into this run (" + why + ") from checkpoint " +
            ck.path().filename().string() + "; was it written by another model, optimizer or version?";
    try {
      group_.store().set(checkpointer::unloadable_key(ck.path()), launch::to_bytes(why));
      group_.store().set(group_.key("checkpoint_unloadable"), launch::to_bytes(ck.path().string()));
    } catch (const std::exception&) {  // the store went away: the error below still says it all
    }
    throw Error(why + ". The group restarts from an older checkpoint if there is one; to resume from a "
                "particular one set RunConfig::resume_from, or start afresh (" + start_advice(Start::fresh) + ")");
  }
}

template <class Policies>
template <class Module, class Optimizer>
checkpointer::Snapshot Context<Policies>::checkpoint(const Module& model, Optimizer& optimizer, Metrics extras) {
  static_assert(persists, "dtrain: ctx.checkpoint(model, optimizer) needs a Checkpointer that persists; "
                          "this Trainer uses checkpointer::none. Add dtrain::checkpointer::directory<> to the "
                          "Trainer's policies.");
  const auto t0 = std::chrono::steady_clock::now();
  checkpoints_.wait();
  checkpointer::Snapshot s;
  // A strategy that keeps the model whole (ddp<>): rank 0 copies it into the previous snapshot's
  // buffers, memory already faulted in, once that write is done (issue 15's stall).
  s.model = model_state(model, &snapshot_buffers_);
  s.has_model = world_rank() == 0;
  if constexpr (strategy_ops::shards_optimizer) {
    check_optimizer(optimizer);
    s.optimizer = checkpointer::detail::optimizer_bytes(optimizer);
    s.sharded_optimizer = true;
  } else if (world_rank() == 0) {
    // A torch optimizer's state is copied here and serialized by the writer (issue 15's stall):
    // the archive and Python's dict keep the tensors of this moment, the optimizer goes on with
    // copies of them.
    if constexpr (std::is_base_of_v<torch::optim::Optimizer, Optimizer>) {
      auto archive = std::make_shared<torch::serialize::OutputArchive>();
      optimizer.save(*archive);
      auto python = checkpointer::detail::python_optimizer_state(optimizer, /*copy=*/false);
      if (python && checkpointer::detail::renew_state_tensors(optimizer, &snapshot_buffers_)) {
        s.optimizer_archive = std::move(archive);
        s.python_optimizer = std::move(python);
      }
    }
    if (!s.optimizer_archive) s.optimizer = checkpointer::detail::optimizer_bytes(optimizer);
  }
  if constexpr (!strategy_ops::shards_optimizer && std::is_base_of_v<torch::optim::Optimizer, Optimizer>)
    if (world_rank() == 0 && !s.optimizer_archive)
      s.python_optimizer = checkpointer::detail::python_optimizer_state(optimizer);
  // The Precision policy's state (amp's GradScaler); replicated, so rank 0's.
  if constexpr (requires(const precision_state& p, torch::serialize::OutputArchive& a) { p.save(a); })
    if (world_rank() == 0) s.precision = checkpointer::detail::archive_bytes(precision_);
  if constexpr (checkpointer::DescribedModel<Module>)
    if (world_rank() == 0) s.model_config = checkpointer::describe_model(model);
  s.extras = std::move(extras);
  s.generator = checkpointer::detail::default_generator_state();
  if (device_.is_cuda()) s.cuda_generator = checkpointer::detail::device_generator_state(device_);
  std::tie(s.epoch, s.position) = cursor_.resume_point();
  s.offset = cursor_.resume_offset();
  s.steps = steps_;
  snapshot_buffers_.finish();
  checkpoints_.add_blocked(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return s;
}

template <class Policies>
template <class Names>
void Context<Policies>::record_evaluation(const std::string& name, const evaluation::ConfusionMatrix& cm, const Names& class_names,
                       const std::string& checkpoint, const Metrics& extra) {
  if (world_rank() != 0) return;
  Metrics metrics = cm.summary();
  for (const auto& [k, v] : extra) metrics.insert_or_assign(k, v);
  std::vector<std::string> names(std::begin(class_names), std::end(class_names));
  tracking::record_evaluation(dir_, tracking::evaluation_json(name, metrics, names, cm.counts_table(), checkpoint,
                                                              unix_now()));
  meter_.note("evaluation " + name + ": " + metrics_line(metrics));
}

template <class Policies>
std::optional<checkpointer::Checkpoint> Context<Policies>::best_checkpoint() {
  static_assert(persists, "dtrain: ctx.best_checkpoint() needs a Checkpointer that persists; this Trainer "
                          "uses checkpointer::none. Add dtrain::checkpointer::directory<> to the Trainer's "
                          "policies.");
  checkpoints_.wait();
  ++syncs_;
  group_.arrive("best_checkpoint/" + std::to_string(syncs_), "best_checkpoint() call " + std::to_string(syncs_),
                reports_);
  return checkpoints_.best();
}

template <class Policies>
void Context<Policies>::finish() {
  meter_.close(steps_, cursor_.epoch(), cursor_.epoch_batches(), /*finished=*/!stopped_);
  // The driver tells a run its stop cut short ("stopped") from one that ran out of work first.
  if (stopped_) group_.store().set(launch::stopped_early_key(group_.identity().attempt), launch::to_bytes("1"));
  checkpoints_.finish();
  // A GPU backend's collectives complete on the device: surface their errors before finishing.
  backend_traits<backend>::synchronize(comm_);
  group_.finish(reports_);
  if (world_rank() == 0) MetricsHistory::read_jsonl(dir_.history()).write_csv(dir_.history_table());
}

template <class Policies>
template <class Optimizer>
void Context<Policies>::check_optimizer(const Optimizer& opt) {
  if (!models_.first_sight(opt)) return;
  std::vector<torch::Tensor> params;
  for (const auto& g : opt.param_groups())
    for (const auto& p : g.params()) params.push_back(p);
  models_.for_each([&](auto& s) { strategy_ops::check_optimizer(s, params); });
  // A step where no parameter has a gradient (none, or only the zeros a Strategy's buckets start
  // with) trains nothing: the loop never ran backward. Said once, by rank 0, with the fix; the run
  // goes on (a phase that steps on purpose stays legal).
  auto has_gradient = [](const torch::Tensor& p) { return p.grad().defined() && p.grad().ne(0).any().item<bool>(); };
  if (world_rank() == 0 && !params.empty() && std::none_of(params.begin(), params.end(), has_gradient)) {
    std::fprintf(stderr,
                 "dtrain: warning: ctx.step(optimizer) at step %lld: none of the optimizer's %zu parameters has a "
                 "gradient, so the step changes nothing. Call ctx.backward(loss) (or loss.backward()) before "
                 "ctx.step(optimizer)\n",
                 static_cast<long long>(steps_ + 1), params.size());
  }
}

template <class Policies>
Metrics Context<Policies>::record(const Metrics& metrics) {
  ++reports_;
  mark_progress("report() call #", reports_);
  group_.arrive("report/" + std::to_string(reports_), "report() call " + std::to_string(reports_), reports_);
  Metrics row = metrics;
  row.try_emplace("iteration", reports_);
  row.try_emplace("epoch", cursor_.epoch());
  row.try_emplace("step", steps_);
  row.try_emplace("timestamp", unix_now());
  const double iter_s = timing_.fill_times(row);
  if constexpr (precision_ops::loss_scaling) {
    row.try_emplace("skipped_steps", precision_ops::skipped_steps(precision_));
    row.try_emplace("loss_scale", precision_ops::loss_scale(precision_));
  }
  // Rank 0 asks the stop_when() rule here; its answer travels in the report's one collective,
  // with the samples, so every rank ends at this same report.
  const bool stop_here = world_rank() == 0 && stop_rule_ && stop_rule_(row);
  auto sums = torch::tensor({static_cast<double>(timing_.take_samples()), stop_here ? 1.0 : 0.0},
                            torch::TensorOptions().dtype(torch::kFloat64));
  if constexpr (backend::uses_cuda) sums = sums.to(device_);
  comm_.allreduce(sums, reduce::sum).wait();
  sums = sums.cpu();
  tracking::ReportTiming::fill_rate(row, sums[0].item<double>(), iter_s);
  if (sums[1].item<double>() > 0) rule_fired_ = true;
  if (world_rank() == 0) {
    MetricsHistory::append_jsonl(dir_.history(), row);
    if constexpr (requires(const tracking::RunRecord& r, const Metrics& m) { Policies::tracker::report(r, m); }) {
      if (!tracked_) tracked_ = tracking::RunRecord::read_started(dir_.path());
      Policies::tracker::report(*tracked_, row);
    }
  }
  meter_.note("report " + std::to_string(reports_) + ": " + metrics_line(metrics));
  return row;
}

DTRAIN_NAMESPACE_END
