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
std::vector<std::vector<std::size_t>> bucket_assignment(const std::vector<torch::Tensor>& params,
                                                        std::int64_t first_bucket_bytes,
                                                        std::int64_t bucket_bytes_cap);

/// fsdp<>'s units: indices into `names` (the dotted names of the parameters that require grad,
/// in registration order), unit by unit. Under wrap::top_level one unit per top-level submodule
/// (the name's first component; the root's own parameters, with no dot, form one unit), in the
/// order in which each first appears; under wrap::layers as under top_level, but a name with an
/// all-digit component (an element of a module list) keys its unit by the name up to it
/// (`bert.encoder.layer.3`); under wrap::whole_model one unit. Indices within a unit
/// keep registration order. No unit is empty.
std::vector<std::vector<std::size_t>> unit_assignment(const std::vector<std::string>& names, wrap units);

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
flat_layout layout_of(const std::vector<std::int64_t>& numels, int world);

}  // namespace strategy

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/strategy/impl/assignment.ipp>
#endif
