// SPDX-License-Identifier: Apache-2.0
#pragma once
// What dtrain asks of a dataset, and the in-memory model of it.

#include <concepts>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include <torch/types.h>
#include <torch/data/example.h>

#include <dtrain/data/fields.hpp>
#include <dtrain/error.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace data {

/// One batch of a (data, target) dataset: inputs and targets, the first dimension the batch. A
/// dataset may return any BatchType instead, such as data::Fields (named tensors).
using Batch = torch::data::Example<>;

/// A dataset a worker can draw batches from by index.
///
/// Minimal complete definition: `size()`, the number of samples, and `get_batch(indices)`, the batch
/// of the samples at `indices` (a 1-D int64 CPU tensor), in that order, of a BatchType (data::Batch,
/// data::Fields, ...).
/// Laws: `samples_in(get_batch(i)) == i.numel()` (a pipeline's filter may drop samples: then at
/// most); the same indices give equal batches.
/// Models: data::TensorDataset, data::Pipelined.
template <class D>
concept RandomAccess = requires(const D& d, const torch::Tensor& indices) {
  { d.size() } -> std::convertible_to<std::int64_t>;
  requires BatchType<std::remove_cvref_t<decltype(d.get_batch(indices))>>;
};

/// The batch type of dataset `D`.
template <RandomAccess D>
using batch_of = std::remove_cvref_t<decltype(std::declval<const D&>().get_batch(std::declval<const torch::Tensor&>()))>;

/// A set of named splits, such as data::FashionMnist: `train()` gives the split a trainer shards.
template <class D>
concept Splits = requires(const D& d) {
  { d.train() } -> RandomAccess;
};

/// Samples held as two tensors whose first dimension is the sample: `data` [N, ...], `targets` [N].
class TensorDataset {
 public:
  TensorDataset() = default;
  TensorDataset(torch::Tensor data, torch::Tensor targets);

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

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/data/impl/dataset.ipp>
#endif
