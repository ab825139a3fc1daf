// SPDX-License-Identifier: Apache-2.0
#pragma once
// strategy::fsdp<>'s model state as full tensors by name, the format of ddp<>'s model.pt: gathered
// from the shards for a checkpoint, and cut into this rank's shards again when one is loaded.
// Free functions over fsdp<>'s per-model state (`Sharded`: its units, parameters, names, shapes).

#include <cstdint>
#include <map>
#include <string>

#include <torch/nn/module.h>
#include <torch/types.h>

#include <dtrain/detail/memory.hpp>
#include <dtrain/error.hpp>
#include <dtrain/strategy/detail/flat_storage.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace strategy::detail {

/// The model's full parameters and buffers by name (clones), gathered unit by unit: a collective
/// that every rank calls; the dictionary is filled on rank 0 only.
template <class Sharded>
c10::Dict<std::string, at::Tensor> full_state(Sharded& s) {
  torch::NoGradGuard no_grad;
  const bool root = s.comm.rank() == 0;
  std::map<std::string, torch::Tensor> gathered;
  for (auto& u : s.units) {
    const bool had = s.current(u);
    if (!had) {
      if (!u.gathered) allocate_storage(u.full, u.full_bytes(), u.spare_full);
      u.gathered = true;  // for reshard() below
      s.comm.allgather(u.full, u.shard.detach()).wait();
      ++s.stats.allgathers;
      u.gathered_version = u.shard._version();
      s.set_views(u);
    }
    if (root)
      for (std::size_t i = 0; i < u.params.size(); ++i) {
        const auto k = u.params[i];
        gathered[s.names[k]] = u.full.narrow(0, u.offsets[i], s.numel_of(k)).view(s.shapes[k]).clone();
      }
    if (!had) s.reshard(u);
  }
  c10::Dict<std::string, at::Tensor> d;
  if (!root) return d;
  for (const auto& p : s.module.named_parameters(true)) {
    auto it = gathered.find(p.key());
    d.insert(p.key(), it != gathered.end() ? it->second : p.value().detach().clone());
  }
  for (const auto& b : s.module.named_buffers(true)) d.insert(b.key(), b.value().detach().clone());
  return d;
}

/// Loads full tensors by name: this rank's shard of each unit, and the unsharded parameters and
/// buffers. Throws Error naming a missing or misshapen tensor; `source` names where they came from.
template <class Sharded>
void load_full_state(Sharded& s, const std::map<std::string, torch::Tensor>& state, const std::string& source) {
  torch::NoGradGuard no_grad;
  auto find = [&](const std::string& name, at::IntArrayRef shape) -> const torch::Tensor& {
    auto it = state.find(name);
    if (it == state.end()) throw Error(source + " has no tensor \"" + name + "\"; was it saved from another model?");
    if (it->second.sizes() != shape)
      throw Error(source + ": \"" + name + "\" has shape " + c10::str(it->second.sizes()) + ", the model " +
                  c10::str(shape));
    return it->second;
  };
  const int rank = s.comm.rank();
  for (auto& u : s.units) {
    auto flat = torch::zeros({u.padded()}, u.shard.options().requires_grad(false));
    for (std::size_t i = 0; i < u.params.size(); ++i) {
      const auto k = u.params[i];
      flat.narrow(0, u.offsets[i], s.numel_of(k)).copy_(find(s.names[k], s.shapes[k]).reshape({-1}));
    }
    s.reshard(u);
    u.shard.detach().copy_(flat.narrow(0, rank * u.shard_numel, u.shard_numel));
  }
  for (auto& p : s.module.named_parameters(true))
    if (!s.index_of.count(p.value().unsafeGetTensorImpl())) p.value().detach().copy_(find(p.key(), p.value().sizes()));
  for (auto& b : s.module.named_buffers(true)) b.value().detach().copy_(find(b.key(), b.value().sizes()));
}

/// Bytes of parameters and gradients this rank holds now: shards, their gradients, anything
/// gathered at the moment, and the parameters that are not sharded.
template <class Sharded>
std::int64_t held_bytes(const Sharded& s) {
  using dtrain::detail::bytes_of;
  std::int64_t n = 0;
  for (const auto& u : s.units) {
    n += bytes_of(u.shard) + bytes_of(u.shard.grad()) + bytes_of(u.grad_full) + bytes_of(u.grad_piece);
    if (u.gathered) n += static_cast<std::int64_t>(u.full_bytes());
  }
  for (const auto& p : s.module.parameters())
    if (!s.index_of.count(p.unsafeGetTensorImpl())) n += bytes_of(p) + bytes_of(p.grad());
  return n;
}

}  // namespace strategy::detail

DTRAIN_NAMESPACE_END
