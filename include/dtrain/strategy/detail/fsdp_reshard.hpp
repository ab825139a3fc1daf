// SPDX-License-Identifier: Apache-2.0
#pragma once
// strategy::fsdp<>'s optimizer state saved by one world size, loaded by another: every rank reads
// every saved rank's optimizer archive (optimizer_rank_RRRRR.pt), joins each unit's per-value
// state (Adam's exp_avg, exp_avg_sq, SGD's momentum buffer, ...) across them, drops the old
// padding, pads for its own world and keeps its own piece. Per-parameter scalars (Adam's step)
// must agree across the saved ranks. The model's parameters need none of this: model.pt is whole.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include <torch/optim/optimizer.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <torch/types.h>

#include <dtrain/checkpointer/optimizer_options.hpp>
#include <dtrain/checkpointer/python_format.hpp>
#include <dtrain/error.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace strategy::detail {

/// One unit of the model as this world cuts it: `numel` values of its own, `shard_numel` per rank.
struct unit_extent {
  std::int64_t numel = 0, shard_numel = 0;
};

/// One unit's values as the ranks of another world saved them (`pieces`, in rank order, each that
/// world's even cut of the unit padded with zeros), re-cut for `rank`: joined, the padding past
/// the unit's `numel` values dropped, zeros appended up to this world's padding, and this rank's
/// `shard_numel` values taken (a new tensor). Exactly the piece a run of this world would hold.
torch::Tensor reshard_flat(const std::vector<torch::Tensor>& pieces, std::int64_t numel, int rank,
                           std::int64_t shard_numel);

/// Saved rank `rank`'s optimizer archive from `file`. Throws Error naming the file when it is
/// missing or does not load (truncated, damaged).
void read_saved_optimizer(torch::serialize::InputArchive& archive, const std::filesystem::path& file, int rank,
                          int saved_world);

namespace reshard {

bool same_value(const c10::IValue& a, const c10::IValue& b);

std::string shown(const c10::IValue& v);

// The state keys of a saved archive's param group `group`, which must hold `expected` tensors.
std::vector<std::string> saved_keys(torch::serialize::InputArchive& groups, std::size_t group,
                                    std::size_t expected, const std::string& file);

}  // namespace reshard

/// Loads into `optimizer`, built over this rank's shards, the state that the ranks of another world
/// saved, one archive per saved rank (`saved`, in rank order): for each tensor it steps,
/// `extent_of(tensor)` names its unit (nothing: not one of the model's shards, an Error). Each
/// state value of a unit's saved pieces' shape is re-cut for `rank` (reshard_flat); every other
/// value (a step count) must be equal in all saved pieces, else Error naming it. The param groups'
/// options are rank 0's (restore_group_options). Every saved archive is held at once while it
/// loads: the full optimizer state, briefly, on every rank.
void load_resharded_optimizer(torch::optim::Optimizer& optimizer, const std::vector<std::filesystem::path>& saved,
                                     int rank, const std::function<std::optional<unit_extent>(const torch::Tensor&)>& extent_of);

/// load_resharded_optimizer over fsdp<>'s per-model state `s` (strategy/fsdp.hpp): its units'
/// shards and their extents. An optimizer that is not a torch::optim::Optimizer throws ConfigError.
template <class Sharded, class Optimizer>
void load_resharded_optimizer(const Sharded& s, Optimizer& optimizer, const std::vector<std::filesystem::path>& saved) {
  if constexpr (std::is_base_of_v<torch::optim::Optimizer, Optimizer>) {
    torch::NoGradGuard no_grad;
    load_resharded_optimizer(optimizer, saved, s.comm.rank(), [&](const torch::Tensor& p) -> std::optional<unit_extent> {
      for (const auto& u : s.units)
        if (u.shard.unsafeGetTensorImpl() == p.unsafeGetTensorImpl()) return unit_extent{u.numel, u.shard_numel};
      return std::nullopt;
    });
  } else {
    throw ConfigError("strategy::fsdp<> re-cuts saved optimizer state for another worker count only for a "
                      "torch::optim::Optimizer (SGD, Adam, AdamW, RMSprop, Adagrad, ...); this optimizer type is "
                      "not one. Resume with ScalingConfig::num_workers = " + std::to_string(saved.size()) +
                      ", or restore the weights only with ctx.restore(ck, model)");
  }
}

}  // namespace strategy::detail

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/strategy/detail/impl/fsdp_reshard.ipp>
#endif
