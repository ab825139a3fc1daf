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
Context<Policies>::Context(const launch::WorkerIdentity& who, c10::intrusive_ptr<c10d::Store> store,
                           const ScalingConfig& scaling, const RunConfig& run)
    : core_(who, std::move(store), scaling, run, backend::device(who.local_rank)),
      comm_(c10::make_intrusive<c10d::PrefixStore>(core_.group.key("pg"), core_.group.store_ptr()), who,
            run.collective_timeout),
      precision_(precision_ops::make_state(core_.device, comm_)),
      checkpoints_(core_.group, run) {
  backend_traits<backend>::on_stall(comm_, [this] { core_.group.check_peers("a collective"); });
  core_.start(checkpoints_.resumed(), ElasticSampler<trainer_sampler>);
}

template <class Policies>
template <data::RandomAccess Split, class Sampler>
auto Context<Policies>::shard(const Split& split, std::int64_t global_batch, Sampler) {
  static_assert(SamplerPolicy<Sampler>,
                "dtrain: ctx.shard(split, global_batch, sampler): the third argument must be a Sampler "
                "policy value, such as dtrain::sampler::sequential{}");
  const int world = world_size();
  const std::int64_t batch_size = core_.batch_size(global_batch);
  constexpr bool counted = std::is_same_v<Sampler, trainer_sampler>;
  const auto n = static_cast<std::int64_t>(split.size());
  // Each shard of the Trainer's Sampler keeps its own position: the one the loop trains on is the
  // one a checkpoint saves, whatever it evaluates with besides (sampler/cursor.hpp).
  [[maybe_unused]] std::int64_t id = -1;
  // A resumed epoch that continues from its global sample offset (another worker count): the
  // rest of it, dealt to this group's ranks.
  std::optional<std::int64_t> offset;
  if constexpr (counted) {
    id = core_.cursor.open(n);
    offset = core_.cursor.continue_from(id, global_batch);
  }
  auto order = [&] {
    // A run-time seed (RunConfig::seed, else enable_reproducibility's) replaces the Sampler's own.
    if constexpr (counted && SeededSampler<Sampler>)
      if (const auto seed = core_.run.seed ? core_.run.seed : sampler::process_seed()) {
        if constexpr (requires { Sampler::indices_from(0, 0, 0, 1, 0, *seed); })
          if (offset) return Sampler::indices_from(*offset, n, world_rank(), world, core_.cursor.epoch(), *seed);
        return Sampler::indices(n, world_rank(), world, core_.cursor.epoch(), *seed);
      }
    if constexpr (ElasticSampler<Sampler>)
      if (offset) return Sampler::indices_from(*offset, n, world_rank(), world, core_.cursor.epoch());
    return Sampler::indices(n, world_rank(), world, core_.cursor.epoch());
  }();
  std::int64_t first = 0;
  if constexpr (counted) first = core_.cursor.begin_shard(id, data::batch_count(static_cast<std::int64_t>(order.size()), batch_size));
  constexpr bool prefetching = backend_traits<backend>::has_batch_transfer;
  // Each batch is a sign of progress (FailureConfig::progress_timeout), of any shard.
  data::BatchObserver observe = [](std::int64_t b, std::int64_t) { mark_progress("batch # of an epoch (ctx.shard)", b); };
  if constexpr (counted)
    observe = [this, world, id](std::int64_t b, std::int64_t len) {
      mark_progress("batch # of an epoch (ctx.shard)", b);
      if (!prefetching) core_.cursor.reached(id, b);  // prefetching counts batches handed out instead
      core_.meter.add_samples(len * world);
      core_.timing.add_samples(len);
    };
  auto view = data::batches(split, std::move(order), batch_size, first, std::move(observe), core_.cursor.epoch());
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
    if constexpr (counted) on_yield = [this, id, next = first]() mutable { core_.cursor.reached(id, next++); };
    return until_stop(data::prefetch(std::move(view), typename backend::batch_transfer(core_.device), std::move(on_yield)));
  } else {
    return until_stop(std::move(view));
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
  // buffers, memory already faulted in, once that write is done, so the copy does not
  // stall the training thread on fresh memory.
  s.model = model_state(model, &core_.snapshot_buffers);
  s.has_model = world_rank() == 0;
  if constexpr (strategy_ops::shards_optimizer) {
    check_optimizer(optimizer);
    s.optimizer = checkpointer::detail::optimizer_bytes(optimizer);
    s.sharded_optimizer = true;
  } else if (world_rank() == 0) {
    // A torch optimizer's state is copied here and serialized by the writer (no stall of the
    // training thread on the serialization):
    // the archive and Python's dict keep the tensors of this moment, the optimizer goes on with
    // copies of them.
    if constexpr (std::is_base_of_v<torch::optim::Optimizer, Optimizer>) {
      auto archive = std::make_shared<torch::serialize::OutputArchive>();
      optimizer.save(*archive);
      auto python = checkpointer::detail::python_optimizer_state(optimizer, /*copy=*/false);
      if (python && checkpointer::detail::renew_state_tensors(optimizer, &core_.snapshot_buffers)) {
        s.optimizer_archive = std::move(archive);
        if (core_.run.checkpoint.python_optimizer_state) s.python_optimizer = std::move(python);
      }
    }
    if (!s.optimizer_archive) s.optimizer = checkpointer::detail::optimizer_bytes(optimizer);
  }
  if constexpr (!strategy_ops::shards_optimizer && std::is_base_of_v<torch::optim::Optimizer, Optimizer>)
    if (world_rank() == 0 && !s.optimizer_archive && core_.run.checkpoint.python_optimizer_state)
      s.python_optimizer = checkpointer::detail::python_optimizer_state(optimizer);
  // The Precision policy's state (amp's GradScaler); replicated, so rank 0's.
  if constexpr (requires(const precision_state& p, torch::serialize::OutputArchive& a) { p.save(a); })
    if (world_rank() == 0) s.precision = checkpointer::detail::archive_bytes(precision_);
  if constexpr (checkpointer::DescribedModel<Module>)
    if (world_rank() == 0) s.model_config = checkpointer::describe_model(model);
  if (world_rank() == 0) s.adapter_config = checkpointer::detail::adapter_config_of(detail::as_module(model));
  s.extras = std::move(extras);
  core_.fill_snapshot(s);
  checkpoints_.add_blocked(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return s;
}

template <class Policies>
template <class Names>
void Context<Policies>::record_evaluation(const std::string& name, const evaluation::ConfusionMatrix& cm,
                                          const Names& class_names, const std::string& checkpoint,
                                          const Metrics& extra) {
  core_.record_evaluation(name, cm, std::vector<std::string>(std::begin(class_names), std::end(class_names)),
                          checkpoint, extra);
}

template <class Policies>
std::optional<checkpointer::Checkpoint> Context<Policies>::best_checkpoint() {
  static_assert(persists, "dtrain: ctx.best_checkpoint() needs a Checkpointer that persists; this Trainer "
                          "uses checkpointer::none. Add dtrain::checkpointer::directory<> to the Trainer's "
                          "policies.");
  checkpoints_.wait();
  ++core_.syncs;
  core_.group.arrive("best_checkpoint/" + std::to_string(core_.syncs),
                     "best_checkpoint() call " + std::to_string(core_.syncs), core_.reports);
  return checkpoints_.best();
}

template <class Policies>
void Context<Policies>::finish() {
  core_.finish_meter();
  checkpoints_.finish();
  // A GPU backend's collectives complete on the device: surface their errors before finishing.
  backend_traits<backend>::synchronize(comm_);
  core_.finish_group();
}

template <class Policies>
template <class Optimizer>
void Context<Policies>::check_optimizer(const Optimizer& opt) {
  if (!models_.first_sight(opt)) return;
  std::vector<torch::Tensor> params;
  for (const auto& g : opt.param_groups())
    for (const auto& p : g.params()) params.push_back(p);
  models_.for_each([&](auto& s) { strategy_ops::check_optimizer(s, params); });
  core_.warn_if_no_gradient(params);
}

template <class Policies>
Metrics Context<Policies>::record(const Metrics& metrics) {
  Metrics row = core_.report_row(metrics);
  if constexpr (precision_ops::loss_scaling) {
    row.try_emplace("skipped_steps", precision_ops::skipped_steps(precision_));
    row.try_emplace("loss_scale", precision_ops::loss_scale(precision_));
  }
  auto sums = core_.report_sums(row);
  if constexpr (backend::uses_cuda) sums = sums.to(core_.device);
  comm_.allreduce(sums, reduce::sum).wait();
  void (*tracker_report)(const tracking::RunRecord&, const Metrics&) = nullptr;
  if constexpr (requires(const tracking::RunRecord& r, const Metrics& m) { Policies::tracker::report(r, m); })
    tracker_report = &Policies::tracker::report;
  core_.report_done(row, sums.cpu(), metrics, tracker_report);
  return row;
}

DTRAIN_NAMESPACE_END
