// SPDX-License-Identifier: Apache-2.0
#pragma once
// A param group's options (lr, momentum, betas, weight decay, ...) read back from an optimizer's
// archive. LibTorch's Optimizer::save() writes them, but its load() reads them and drops them:
// after a learning-rate decay, `optimizer.load(archive)` alone leaves every group at the
// constructor's learning rate, so a resumed run trains with the wrong one. Checkpoint's optimizer
// load calls restore_group_options() after optimizer.load().

#include <cstdint>
#include <string>

#include <torch/optim/optimizer.h>
#include <torch/serialize/input-archive.h>
#include <torch/types.h>

#include <dtrain/error.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace checkpointer::detail {

/// Sets every param group's options of `optimizer` to those saved in `archive` (written by
/// `optimizer.save()`, the layout of torch/optim/serialize.h: param_groups/param_groups/I/options).
/// Each group's options read themselves (OptimizerOptions::serialize, virtual), so every option
/// an optimizer saves comes back (tested for SGD, Adam, AdamW, RMSprop and Adagrad). Throws Error when the
/// archive holds another number of groups (`source` names it).
inline void restore_group_options(torch::optim::Optimizer& optimizer, torch::serialize::InputArchive& archive,
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

}  // namespace checkpointer::detail

DTRAIN_NAMESPACE_END
