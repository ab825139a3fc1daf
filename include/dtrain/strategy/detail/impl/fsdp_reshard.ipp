// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of fsdp_reshard.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/strategy/detail/fsdp_reshard.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace strategy {
namespace detail {

DTRAIN_INLINE torch::Tensor reshard_flat(const std::vector<torch::Tensor>& pieces, std::int64_t numel, int rank,
                                         std::int64_t shard_numel) {
  const auto joined = torch::cat(pieces).narrow(0, 0, numel);
  auto out = torch::zeros({shard_numel}, joined.options());
  const auto begin = rank * shard_numel, end = std::min(begin + shard_numel, numel);
  if (end > begin) out.narrow(0, 0, end - begin).copy_(joined.narrow(0, begin, end - begin));
  return out;
}

DTRAIN_INLINE void read_saved_optimizer(torch::serialize::InputArchive& archive, const std::filesystem::path& file, int rank,
                                        int saved_world) {
  const std::string what = file.string() + " (rank " + std::to_string(rank) + "'s optimizer state, of the " +
                           std::to_string(saved_world) + " ranks that saved it)";
  std::error_code ec;
  if (!std::filesystem::is_regular_file(file, ec))
    throw Error(what + " is missing: resuming strategy::fsdp<> with another worker count reads every saved "
                "rank's piece, so every rank needs the whole checkpoint directory (keep storage_path on storage "
                "all hosts read), or resume with ScalingConfig::num_workers = " + std::to_string(saved_world));
  try {
    archive.load_from(file.string());
  } catch (const c10::Error& e) {
    throw Error(what + " does not load (" + e.what_without_backtrace() +
                "); it is truncated or damaged: resume from an older checkpoint (RunConfig::resume_from)");
  }
}

namespace reshard {

DTRAIN_INLINE bool same_value(const c10::IValue& a, const c10::IValue& b) {
  if (a.isTensor() || b.isTensor()) {
    if (!a.isTensor() || !b.isTensor()) return false;
    const auto &x = a.toTensor(), &y = b.toTensor();
    if (x.defined() != y.defined()) return false;
    return !x.defined() || (x.sizes() == y.sizes() && x.scalar_type() == y.scalar_type() && torch::equal(x, y));
  }
  if (a.isTensorList() || b.isTensorList()) {
    if (!a.isTensorList() || !b.isTensorList()) return false;
    const auto x = a.toTensorVector(), y = b.toTensorVector();
    if (x.size() != y.size()) return false;
    for (std::size_t i = 0; i < x.size(); ++i)
      if (!same_value(x[i], y[i])) return false;
    return true;
  }
  return a == b;
}

DTRAIN_INLINE std::string shown(const c10::IValue& v) {
  if (v.isTensor() && v.toTensor().defined() && v.toTensor().numel() > 1)
    return "a tensor of shape " + c10::str(v.toTensor().sizes());
  std::ostringstream os;
  os << v;
  return os.str();
}

DTRAIN_INLINE std::vector<std::string> saved_keys(torch::serialize::InputArchive& groups, std::size_t group,
                                                  std::size_t expected, const std::string& file) {
  torch::serialize::InputArchive one;
  groups.read("param_groups/" + std::to_string(group), one);
  torch::Tensor size;
  one.read("params/size", size);
  if (size.item<std::int64_t>() != static_cast<std::int64_t>(expected))
    throw Error(file + ": param group " + std::to_string(group) + " holds " + std::to_string(size.item<std::int64_t>()) +
                " tensors and this optimizer's " + std::to_string(expected) +
                "; build the optimizer as the run that saved it did, over ctx.parameters(model)");
  std::vector<std::string> keys;
  for (std::size_t i = 0; i < expected; ++i) {
    c10::IValue key;
    one.read("params/" + std::to_string(i), key);
    keys.push_back(key.toStringRef());
  }
  return keys;
}
}  // namespace reshard

DTRAIN_INLINE void load_resharded_optimizer(torch::optim::Optimizer& optimizer, const std::vector<std::filesystem::path>& saved,
                                     int rank, const std::function<std::optional<unit_extent>(const torch::Tensor&)>& extent_of) {
  const int world = static_cast<int>(saved.size());
  std::vector<torch::serialize::InputArchive> archives(saved.size());
  for (int r = 0; r < world; ++r) read_saved_optimizer(archives[r], saved[r], r, world);
  const std::string first = saved.front().string();
  // Rank 0's archive gives each tensor its state object of the right type (and the options);
  // its values are replaced below, one parameter at a time, through the state's own serialize().
  optimizer.load(archives[0]);
  checkpointer::detail::restore_group_options(optimizer, archives[0], first);
  std::vector<torch::serialize::InputArchive> saved_state(saved.size()), saved_groups(saved.size());
  for (int r = 0; r < world; ++r) {
    archives[r].read("state", saved_state[r]);
    archives[r].read("param_groups", saved_groups[r]);
  }
  auto& groups = optimizer.param_groups();
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const auto& params = groups[g].params();
    std::vector<std::vector<std::string>> keys;  // [saved rank][tensor]
    for (int r = 0; r < world; ++r) keys.push_back(reshard::saved_keys(saved_groups[r], g, params.size(), saved[r].string()));
    for (std::size_t i = 0; i < params.size(); ++i) {
      const auto& p = params[i];
      const auto live = optimizer.state().find(checkpointer::detail::optimizer_state_key(optimizer.state(), p));
      const std::string where = "the state of tensor " + std::to_string(i) + " of param group " + std::to_string(g);
      std::vector<torch::serialize::InputArchive> states(saved.size());
      int with_state = 0;
      for (int r = 0; r < world; ++r) with_state += saved_state[r].try_read(keys[r][i], states[r]) ? 1 : 0;
      if (with_state == 0) continue;  // never stepped
      if (with_state != world || live == optimizer.state().end())
        throw Error(where + " is in " + std::to_string(with_state) + " of the " + std::to_string(world) +
                    " saved optimizer files (" + first + " ...): the ranks did not step the same tensors");
      const auto extent = extent_of(p);
      if (!extent)
        throw ConfigError(where + " is not one of the model's fsdp<> shards, so its state cannot be re-cut for " +
                          "another worker count; build the "
                          "optimizer over ctx.parameters(model) only, or resume with ScalingConfig::num_workers = " +
                          std::to_string(world));
      const std::int64_t saved_shard = (extent->numel + world - 1) / world;
      torch::serialize::OutputArchive out;
      for (const auto& name : states[0].keys()) {
        std::vector<c10::IValue> values(saved.size());
        for (int r = 0; r < world; ++r)
          if (!states[r].try_read(name, values[r]))
            throw Error(saved[r].string() + ": " + where + " has no \"" + name + "\", which rank 0's has");
        const bool per_value = values[0].isTensor() && values[0].toTensor().defined() &&
                               values[0].toTensor().dim() == 1 && values[0].toTensor().size(0) == saved_shard;
        if (per_value) {
          std::vector<torch::Tensor> pieces;
          for (int r = 0; r < world; ++r) {
            const auto t = values[r].isTensor() ? values[r].toTensor() : torch::Tensor();
            if (!t.defined() || t.sizes() != values[0].toTensor().sizes())
              throw Error(saved[r].string() + ": " + where + ": \"" + name + "\" is " + reshard::shown(values[r]) +
                          ", rank 0's a tensor of " + std::to_string(saved_shard) + " values");
            pieces.push_back(t);
          }
          out.write(name, reshard_flat(pieces, extent->numel, rank, extent->shard_numel));
          continue;
        }
        for (int r = 1; r < world; ++r)
          if (!reshard::same_value(values[0], values[r]))
            throw Error(where + ": \"" + name + "\" is " + reshard::shown(values[0]) + " in " + first + " and " +
                        reshard::shown(values[r]) + " in " + saved[r].string() +
                        "; a value that is not cut into shards must agree across the ranks that saved it "
                        "(they did not save the same step)");
        out.write(name, values[0]);
      }
      std::stringstream bytes;
      out.save_to(bytes);
      torch::serialize::InputArchive in;
      in.load_from(bytes);
      live->second->serialize(in);
    }
  }
}
}  // namespace detail
}  // namespace strategy
DTRAIN_NAMESPACE_END
