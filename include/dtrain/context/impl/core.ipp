// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of core.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <algorithm>
#include <cstdio>
#include <utility>

#include <dtrain/context/core.hpp>
#include <dtrain/error.hpp>
#include <dtrain/progress_mark.hpp>
#include <dtrain/result.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace detail {

DTRAIN_INLINE ContextCore::ContextCore(const launch::WorkerIdentity& who, c10::intrusive_ptr<c10d::Store> store,
                                       const ScalingConfig& scaling_config, const RunConfig& run_config,
                                       torch::Device on)
    : group(who, std::move(store), run_config.collective_timeout, run_config.failure.heartbeat_timeout,
            run_config.failure.progress_timeout),
      scaling(scaling_config),
      run(run_config),
      dir(run_config.path()),
      device(on),
      meter(run_config.progress, who.rank == 0, 2, std::nullopt,
            who.rank == 0 ? tracking::StepHistory(dir.step_history(), run_config.progress.record_every)
                          : tracking::StepHistory()),
      stop(group, run_config.failure.stop_poll) {}

DTRAIN_INLINE void ContextCore::start(const std::optional<checkpointer::Checkpoint>& resumed, bool deals_from_offset) {
  const auto& who = group.identity();
  if (who.rank == 0) dir.create();
  std::int64_t kept = 0;  // history rows a resumed run keeps
  if (const auto& ck = resumed) {
    steps = ck->steps();
    reports = kept = ck->iteration();
    // Another worker count continues the epoch from its global sample offset, which a Sampler
    // with indices_from (sampler::distributed<>) deals to the new ranks; any other Sampler, or a
    // checkpoint that saved no offset, resumes exactly only at an epoch boundary. (A rank the
    // checkpoint had no file for would skip nothing while the others skip: a hang.)
    const bool same_world = ck->world_size() == who.world_size;
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
    cursor.resume(position ? position->first : ck->epoch(), position ? position->second : 0,
                  ck->sample_offset(from).value_or(-1), !same_world, ck->shard_samples(from).value_or(-1));
  }
  if (who.rank == 0) {
    MetricsHistory::truncate_jsonl(dir.history(), "iteration", kept);
    meter.history().group_started(steps, cursor.epoch(), who.attempt, who.world_size);
  }
  stop.start_counting_at(steps);
  timing.start(resumed ? resumed->metrics() : Metrics{});
  mark_progress("the start of the train loop");  // FailureConfig::progress_timeout counts from here
}

DTRAIN_INLINE bool ContextCore::stopping() {
  if (rule_fired) return cut_by_rule = true;  // not a stop request: the run ends finished
  if (!stop.should_stop(steps)) return false;
  stopped = true;
  return true;
}

DTRAIN_INLINE void ContextCore::count_step() {
  cursor.trained();
  ++steps;
  meter.on_step(steps, cursor.epoch(), cursor.epoch_batches());
}

DTRAIN_INLINE std::int64_t ContextCore::batch_size(std::int64_t global_batch) const {
  const int world = group.size();
  if (global_batch < 1 || global_batch % world != 0)
    throw ConfigError("global batch " + std::to_string(global_batch) + " does not divide evenly among " +
                      std::to_string(world) + " workers; choose a global batch that is a multiple of the worker " +
                      "count (e.g. " + std::to_string(std::max<std::int64_t>(1, global_batch / world) * world) + ")");
  return global_batch / world;
}

DTRAIN_INLINE Metrics ContextCore::report_row(const Metrics& metrics) {
  ++reports;
  mark_progress("report() call #", reports);
  group.arrive("report/" + std::to_string(reports), "report() call " + std::to_string(reports), reports);
  Metrics row = metrics;
  row.try_emplace("iteration", reports);
  row.try_emplace("epoch", cursor.epoch());
  row.try_emplace("step", steps);
  row.try_emplace("timestamp", unix_now());
  iteration_s = timing.fill_times(row);
  return row;
}

DTRAIN_INLINE torch::Tensor ContextCore::report_sums(const Metrics& row) {
  // Rank 0 asks the stop_when() rule here; its answer travels in the report's one collective,
  // with the samples, so every rank ends at this same report.
  const bool stop_here = group.rank() == 0 && stop_rule && stop_rule(row);
  auto sums = torch::empty({2}, torch::TensorOptions().dtype(torch::kFloat64));
  sums[0] = static_cast<double>(timing.take_samples());
  sums[1] = stop_here ? 1.0 : 0.0;
  return sums;
}

DTRAIN_INLINE void ContextCore::report_done(Metrics& row, const torch::Tensor& sums, const Metrics& metrics,
                                            void (*tracker_report)(const tracking::RunRecord&, const Metrics&)) {
  tracking::ReportTiming::fill_rate(row, sums[0].item<double>(), iteration_s);
  if (sums[1].item<double>() > 0) rule_fired = true;
  if (group.rank() == 0) {
    MetricsHistory::append_jsonl(dir.history(), row);
    if (tracker_report != nullptr) {
      if (!tracked) tracked = tracking::RunRecord::read_started(dir.path());
      tracker_report(*tracked, row);
    }
  }
  meter.note("report " + std::to_string(reports) + ": " + metrics_line(metrics));
}

DTRAIN_INLINE void ContextCore::finish_meter() {
  meter.close(steps, cursor.epoch(), cursor.epoch_batches(), /*finished=*/!stopped);
  // The driver tells a run its stop cut short ("stopped") from one that ran out of work first.
  if (stopped) group.store().set(launch::stopped_early_key(group.identity().attempt), launch::to_bytes("1"));
}

DTRAIN_INLINE void ContextCore::finish_group() {
  group.finish(reports);
  if (group.rank() == 0) MetricsHistory::read_jsonl(dir.history()).write_csv(dir.history_table());
}

DTRAIN_INLINE void ContextCore::naming_file(const checkpointer::Checkpoint& ck, const std::string& file,
                                            const std::function<void()>& load) {
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
    mark_unloadable(ck.path(), why);
    throw Error(why + ". The group restarts from an older checkpoint if there is one; to resume from a "
                "particular one set RunConfig::resume_from, or start afresh (" + start_advice(Start::fresh) + ")");
  }
}

DTRAIN_INLINE void ContextCore::mark_unloadable(const std::filesystem::path& dir, const std::string& why) const {
  try {
    group.store().set(checkpointer::unloadable_key(dir), launch::to_bytes(why));
    group.store().set(group.key("checkpoint_unloadable"), launch::to_bytes(dir.string()));
  } catch (const std::exception&) {  // the store went away: the error itself still says it all
  }
}

DTRAIN_INLINE void ContextCore::record_evaluation(const std::string& name, const evaluation::ConfusionMatrix& cm,
                                                  const std::vector<std::string>& class_names,
                                                  const std::string& checkpoint, const Metrics& extra) {
  if (group.rank() != 0) return;
  Metrics metrics = cm.summary();
  for (const auto& [k, v] : extra) metrics.insert_or_assign(k, v);
  tracking::record_evaluation(dir, tracking::evaluation_json(name, metrics, class_names, cm.counts_table(), checkpoint,
                                                             unix_now()));
  meter.note("evaluation " + name + ": " + metrics_line(metrics));
}

DTRAIN_INLINE void ContextCore::fill_snapshot(checkpointer::Snapshot& s) {
  s.generator = checkpointer::detail::default_generator_state();
  if (device.is_cuda()) s.cuda_generator = checkpointer::detail::device_generator_state(device);
  std::tie(s.epoch, s.position) = cursor.resume_point();
  s.offset = cursor.resume_offset();
  s.samples = cursor.resume_samples();
  s.steps = steps;
  snapshot_buffers.finish();
}

DTRAIN_INLINE void ContextCore::warn_if_no_gradient(const std::vector<torch::Tensor>& params) const {
  // A step where no parameter has a gradient (none, or only the zeros a Strategy's buckets start
  // with) trains nothing: the loop never ran backward. Said once, by rank 0, with the fix; the run
  // goes on (a phase that steps on purpose stays legal).
  auto has_gradient = [](const torch::Tensor& p) { return p.grad().defined() && p.grad().ne(0).any().item<bool>(); };
  if (group.rank() == 0 && !params.empty() && std::none_of(params.begin(), params.end(), has_gradient)) {
    std::fprintf(stderr,
                 "dtrain: warning: ctx.step(optimizer) at step %lld: none of the optimizer's %zu parameters has a "
                 "gradient, so the step changes nothing. Call ctx.backward(loss) (or loss.backward()) before "
                 "ctx.step(optimizer)\n",
                 static_cast<long long>(steps + 1), params.size());
  }
}

}  // namespace detail
DTRAIN_NAMESPACE_END
