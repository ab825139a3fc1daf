// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of schedule.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/schedule/schedule.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace schedule {
namespace detail {

DTRAIN_INLINE std::vector<double> group_lrs(const torch::optim::Optimizer& optimizer) {
  std::vector<double> out;
  for (const auto& g : optimizer.param_groups()) out.push_back(g.options().get_lr());
  return out;
}

DTRAIN_INLINE void set_group_lrs(torch::optim::Optimizer& optimizer, const std::vector<double>& lrs) {
  auto& groups = optimizer.param_groups();
  for (std::size_t i = 0; i < groups.size() && i < lrs.size(); ++i) groups[i].options().set_lr(lrs[i]);
}

DTRAIN_INLINE std::vector<double> doubles(const torch::Tensor& t) {
  const auto c = t.to(torch::kFloat64).contiguous();
  return {c.data_ptr<double>(), c.data_ptr<double>() + c.numel()};
}

DTRAIN_INLINE void save_common(torch::serialize::OutputArchive& a, const char* kind, std::int64_t steps,
                               const std::vector<double>& base, const std::vector<double>& lrs) {
  a.write("kind", c10::IValue(std::string(kind)));
  a.write("steps", torch::tensor(steps));
  a.write("base_lrs", doubles(base));
  a.write("lrs", doubles(lrs));
}

DTRAIN_INLINE void load_common(torch::serialize::InputArchive& a, const char* kind, torch::optim::Optimizer& optimizer,
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
}  // namespace detail
}  // namespace schedule
DTRAIN_NAMESPACE_END
