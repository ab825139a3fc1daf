// SPDX-License-Identifier: Apache-2.0
#pragma once
// Learning-rate schedules: what every schedule has (the LrSchedule concept) and the parts they
// share (reading and setting a torch::optim::Optimizer's learning rates, their archive).
//
// A schedule owns the learning rate of every param group of one optimizer. Its state (the steps
// it counted, the base learning rates, the plateau's best metric, ...) goes into a checkpoint as
// a user object, and load() puts the saved learning rates back into the optimizer:
//
//   dtrain::schedule::StepLR schedule(opt, /*step_size=*/30, /*gamma=*/0.1);
//   if (auto ck = ctx.get_checkpoint()) {
//     ctx.restore(*ck, model, opt);
//     ck->load_object(dtrain::schedule::checkpoint_name, schedule);
//   }
//   ...
//   ctx.report(m, ctx.checkpoint(model, opt).with_object(dtrain::schedule::checkpoint_name, schedule));

#include <cmath>
#include <concepts>
#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/ivalue.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <torch/types.h>

#include <dtrain/error.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace schedule {

/// The name docs and examples save a schedule under (`.with_object(checkpoint_name, schedule)`).
inline constexpr const char* checkpoint_name = "lr_schedule";

/// A learning-rate schedule: it reports the learning rates it set and saves and loads its state
/// (Snapshot::with_object / Checkpoint::load_object take it as it is). How it advances differs:
/// `step()` for StepLR and WarmupCosine, `step(metric)` for ReduceLROnPlateau.
/// Laws: after `b.load(archive of a.save())`, b.lrs() == a.lrs(), b's optimizer has those learning
/// rates, and a and b set the same learning rates from then on.
template <class S>
concept LrSchedule = requires(const S& s, S& m, torch::serialize::OutputArchive& out,
                              torch::serialize::InputArchive& in) {
  { s.lrs() } -> std::same_as<std::vector<double>>;
  { s.steps() } -> std::same_as<std::int64_t>;
  s.save(out);
  m.load(in);
};

namespace detail {

/// The learning rate of each of `optimizer`'s param groups.
std::vector<double> group_lrs(const torch::optim::Optimizer& optimizer);

/// Sets the learning rate of each param group; `lrs` has one per group.
void set_group_lrs(torch::optim::Optimizer& optimizer, const std::vector<double>& lrs);

inline torch::Tensor doubles(const std::vector<double>& v) {
  return torch::tensor(v, torch::dtype(torch::kFloat64));
}
std::vector<double> doubles(const torch::Tensor& t);

/// What every schedule saves: its kind, the steps it took, the base and current learning rates.
void save_common(torch::serialize::OutputArchive& a, const char* kind, std::int64_t steps,
                 const std::vector<double>& base, const std::vector<double>& lrs);

/// Reads what save_common wrote, refusing another kind of schedule or another number of param
/// groups, and sets the optimizer's learning rates to the saved ones.
void load_common(torch::serialize::InputArchive& a, const char* kind, torch::optim::Optimizer& optimizer,
                 std::int64_t& steps, std::vector<double>& base, std::vector<double>& lrs);

inline void require(bool ok, const std::string& what) {
  if (!ok) throw ConfigError(what);
}

}  // namespace detail

}  // namespace schedule

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/schedule/impl/schedule.ipp>
#endif
