// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of optimizer_options.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/checkpointer/optimizer_options.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace checkpointer {
namespace detail {

DTRAIN_INLINE void restore_group_options(torch::optim::Optimizer& optimizer, torch::serialize::InputArchive& archive,
                                         const std::string& source) {
  torch::serialize::InputArchive groups;
  archive.read("param_groups", groups);
  torch::Tensor size;
  groups.read("param_groups/size", size);
  auto& live = optimizer.param_groups();
  if (size.item<std::int64_t>() != static_cast<std::int64_t>(live.size()))
    throw Error(source + " holds " + std::to_string(size.item<std::int64_t>()) + " param groups and the optimizer " +
                std::to_string(live.size()) + "; build the optimizer with the param groups it was saved with");
  for (std::size_t i = 0; i < live.size(); ++i) {
    torch::serialize::InputArchive group, options;
    groups.read("param_groups/" + std::to_string(i), group);
    group.read("options", options);
    live[i].options().serialize(options);
  }
}
}  // namespace detail
}  // namespace checkpointer
DTRAIN_NAMESPACE_END
