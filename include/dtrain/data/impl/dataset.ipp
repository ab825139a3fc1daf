// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of dataset.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/data/dataset.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace data {

DTRAIN_INLINE TensorDataset::TensorDataset(torch::Tensor data, torch::Tensor targets)
    : data_(std::move(data)), targets_(std::move(targets)) {
  if (data_.dim() < 1 || targets_.dim() < 1 || data_.size(0) != targets_.size(0))
    throw DataError("TensorDataset: data and targets must have the same first dimension, got " +
                    std::to_string(data_.dim() ? data_.size(0) : 0) + " and " +
                    std::to_string(targets_.dim() ? targets_.size(0) : 0));
}
}  // namespace data
DTRAIN_NAMESPACE_END
