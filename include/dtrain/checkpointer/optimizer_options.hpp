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
void restore_group_options(torch::optim::Optimizer& optimizer, torch::serialize::InputArchive& archive,
                           const std::string& source);

}  // namespace checkpointer::detail

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/checkpointer/impl/optimizer_options.ipp>
#endif
