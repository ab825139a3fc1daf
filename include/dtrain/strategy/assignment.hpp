// SPDX-License-Identifier: Apache-2.0
#pragma once
// How parameters are grouped into collectives: ddp<>'s gradient buckets and fsdp<>'s units, as
// pure functions of the parameters' sizes, dtypes and names (PyTorch's
// compute_bucket_assignment_by_size is such a function too). Every rank computes the same
// grouping from the same model, which is what keeps the collectives in the same order everywhere.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <torch/types.h>

#include <dtrain/version.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace strategy {

/// What one flat parameter (a "unit": one allgather, one reduce-scatter) covers under fsdp<>.
enum class wrap {
  /// One unit for the whole model.
  whole_model,
  /// One unit per top-level submodule that has parameters (plus one for the root's own
  /// parameters): smaller collectives, and a unit's reduce-scatter starts as soon as backward
  /// has produced its gradients, while backward goes on through the units before it.
  top_level,
  /// One unit per element of a module list (the name up to its first numeric component:
  /// `bert.encoder.layer.3`), the other parameters by top-level submodule as under top_level: a
  /// transformer's unit per encoder layer, whatever depth its layer list has.
  layers,
};

/// ddp<>'s buckets: indices into `params`, bucket by bucket.
///
/// Parameters are taken in reverse order (the order in which backward usually produces their
/// gradients). The first bucket closes once it holds at least `first_bucket_bytes`, later ones
/// once they hold at least `bucket_bytes_cap`; a parameter of another dtype than the one before
/// it starts a new bucket too, since a bucket is one flat tensor. No bucket is empty.
inline std::vector<std::vector<std::size_t>> bucket_assignment(const std::vector<torch::Tensor>& params,
                                                               std::int64_t first_bucket_bytes,
                                                               std::int64_t bucket_bytes_cap) {
  std::vector<std::vector<std::size_t>> buckets;
  if (params.empty()) return buckets;
  buckets.emplace_back();
  std::int64_t cap = first_bucket_bytes, bytes = 0;
  torch::ScalarType dtype = params.back().scalar_type();
  for (std::size_t k = params.size(); k-- > 0;) {
    const auto& p = params[k];
    if (!buckets.back().empty() && (bytes >= cap || p.scalar_type() != dtype)) {
      buckets.emplace_back();
      bytes = 0;
      cap = bucket_bytes_cap;
    }
    dtype = p.scalar_type();
    buckets.back().push_back(k);
    bytes += p.numel() * static_cast<std::int64_t>(p.element_size());
  }
  return buckets;
}

/// fsdp<>'s units: indices into `names` (the dotted names of the parameters that require grad,
/// in registration order), unit by unit. Under wrap::top_level one unit per top-level submodule
/// (the name's first component; the root's own parameters, with no dot, form one unit), in the
/// order in which each first appears; under wrap::layers as under top_level, but a name with an
/// all-digit component (an element of a module list) keys its unit by the name up to it
/// (`bert.encoder.layer.3`); under wrap::whole_model one unit. Indices within a unit
/// keep registration order. No unit is empty.
inline std::vector<std::vector<std::size_t>> unit_assignment(const std::vector<std::string>& names, wrap units) {
  std::vector<std::vector<std::size_t>> groups;
  std::map<std::string, std::size_t> group_of_child;
  for (std::size_t k = 0; k < names.size(); ++k) {
    std::size_t g = 0;
    if (units == wrap::top_level || units == wrap::layers) {
      const auto dot = names[k].find('.');
      std::string child = dot == std::string::npos ? std::string() : names[k].substr(0, dot);
      if (units == wrap::layers) {
        // The components before the parameter's own name: the first all-digit one ends the key.
        for (std::size_t begin = 0, end; (end = names[k].find('.', begin)) != std::string::npos; begin = end + 1)
          if (end > begin && std::all_of(names[k].begin() + static_cast<std::ptrdiff_t>(begin),
                                         names[k].begin() + static_cast<std::ptrdiff_t>(end),
                                         [](char c) { return c >= '0' && c <= '9'; })) {
            child = names[k].substr(0, end);
            break;
          }
      }
      auto [it, fresh] = group_of_child.try_emplace(child, groups.size());
      if (fresh) groups.emplace_back();
      g = it->second;
    } else if (groups.empty()) {
      groups.emplace_back();
    }
    groups[g].push_back(k);
  }
  return groups;
}

/// Where each parameter of one fsdp<> unit lies in its flat vector, and how that vector is cut
/// into one shard per rank.
struct flat_layout {
  std::vector<std::int64_t> offsets;  // where each parameter starts
  std::int64_t numel = 0;             // the parameters' values, back to back
  std::int64_t shard_numel = 0;       // each rank's piece: numel / world, rounded up
  /// The flat vector's length: numel padded with zeros to world * shard_numel.
  std::int64_t padded(int world) const { return shard_numel * world; }
};

/// The layout of parameters of `numels` values each over `world` ranks.
inline flat_layout layout_of(const std::vector<std::int64_t>& numels, int world) {
  flat_layout l;
  for (auto n : numels) {
    l.offsets.push_back(l.numel);
    l.numel += n;
  }
  l.shard_numel = (l.numel + world - 1) / world;
  return l;
}

}  // namespace strategy

DTRAIN_NAMESPACE_END
