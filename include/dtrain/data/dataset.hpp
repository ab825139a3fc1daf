// SPDX-License-Identifier: Apache-2.0
#pragma once
// What dtrain asks of a dataset, and the in-memory model of it.

#include <concepts>
#include <cstdint>
#include <string>
#include <utility>

#include <torch/types.h>
#include <torch/data/example.h>

#include <dtrain/error.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace data {

/// One batch: inputs and targets, the first dimension the batch.
using Batch = torch::data::Example<>;

/// A dataset a worker can draw batches from by index.
///
/// Minimal complete definition: `size()`, the number of samples, and `get_batch(indices)`, the batch
/// of the samples at `indices` (a 1-D int64 CPU tensor), in that order.
/// Laws: `get_batch(i).data.size(0) == i.numel()`; the same indices give equal batches.
/// Models: data::TensorDataset.
template <class D>
concept RandomAccess = requires(const D& d, const torch::Tensor& indices) {
  { d.size() } -> std::convertible_to<std::int64_t>;
  { d.get_batch(indices) } -> std::convertible_to<Batch>;
};

/// A set of named splits, such as data::FashionMnist: `train()` gives the split a trainer shards.
template <class D>
concept Splits = requires(const D& d) {
  { d.train() } -> RandomAccess;
};

/// Samples held as two tensors whose first dimension is the sample: `data` [N, ...], `targets` [N].
class TensorDataset {
 public:
  TensorDataset() = default;
  TensorDataset(torch::Tensor data, torch::Tensor targets)
      : data_(std::move(data)), targets_(std::move(targets)) {
    if (data_.dim() < 1 || targets_.dim() < 1 || data_.size(0) != targets_.size(0))
      throw DataError("TensorDataset: data and targets must have the same first dimension, got " +
                      std::to_string(data_.dim() ? data_.size(0) : 0) + " and " +
                      std::to_string(targets_.dim() ? targets_.size(0) : 0));
  }

  std::int64_t size() const { return data_.defined() ? data_.size(0) : 0; }
  Batch get_batch(const torch::Tensor& indices) const {
    return {data_.index_select(0, indices), targets_.index_select(0, indices)};
  }

  const torch::Tensor& data() const { return data_; }
  const torch::Tensor& targets() const { return targets_; }

 private:
  torch::Tensor data_, targets_;
};

static_assert(RandomAccess<TensorDataset>);

}  // namespace data

DTRAIN_NAMESPACE_END
