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
inline std::vector<double> group_lrs(const torch::optim::Optimizer& optimizer) {
  std::vector<double> out;
  for (const auto& g : optimizer.param_groups()) out.push_back(g.options().get_lr());
  return out;
}

/// Sets the learning rate of each param group; `lrs` has one per group.
inline void set_group_lrs(torch::optim::Optimizer& optimizer, const std::vector<double>& lrs) {
  auto& groups = optimizer.param_groups();
  for (std::size_t i = 0; i < groups.size() && i < lrs.size(); ++i) groups[i].options().set_lr(lrs[i]);
}

inline torch::Tensor doubles(const std::vector<double>& v) {
  return torch::tensor(v, torch::dtype(torch::kFloat64));
}
inline std::vector<double> doubles(const torch::Tensor& t) {
  const auto c = t.to(torch::kFloat64).contiguous();
  return {c.data_ptr<double>(), c.data_ptr<double>() + c.numel()};
}

/// What every schedule saves: its kind, the steps it took, the base and current learning rates.
inline void save_common(torch::serialize::OutputArchive& a, const char* kind, std::int64_t steps,
                        const std::vector<double>& base, const std::vector<double>& lrs) {
  a.write("kind", c10::IValue(std::string(kind)));
  a.write("steps", torch::tensor(steps));
  a.write("base_lrs", doubles(base));
  a.write("lrs", doubles(lrs));
}

/// Reads what save_common wrote, refusing another kind of schedule or another number of param
/// groups, and sets the optimizer's learning rates to the saved ones.
inline void load_common(torch::serialize::InputArchive& a, const char* kind, torch::optim::Optimizer& optimizer,
                        std::int64_t& steps, std::vector<double>& base, std::vector<double>& lrs) {
  c10::IValue saved_kind;
  a.read("kind", saved_kind);
  if (saved_kind.toStringRef() != kind)
    throw ConfigError(std::string("a ") + kind + " cannot load the state of a " + saved_kind.toStringRef() +
                      "; load it into the schedule type it was saved from");
  torch::Tensor t, b, l;
  a.read("steps", t);
  a.read("base_lrs", b);
  a.read("lrs", l);
  auto saved_base = doubles(b), saved_lrs = doubles(l);
  if (saved_lrs.size() != optimizer.param_groups().size())
    throw ConfigError(std::string(kind) + ": the saved schedule drove " + std::to_string(saved_lrs.size()) +
                      " param groups and this optimizer has " + std::to_string(optimizer.param_groups().size()) +
                      "; build the optimizer with the param groups it was saved with");
  steps = t.item<std::int64_t>();
  base = std::move(saved_base);
  lrs = std::move(saved_lrs);
  set_group_lrs(optimizer, lrs);
}

inline void require(bool ok, const std::string& what) {
  if (!ok) throw ConfigError(what);
}

}  // namespace detail

}  // namespace schedule

DTRAIN_NAMESPACE_END
