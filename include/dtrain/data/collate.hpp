// SPDX-License-Identifier: Apache-2.0
#pragma once
// Collate functions for data::collate: samples (data::Fields of one sample each) into one batch.

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <torch/types.h>

#include <dtrain/data/fields.hpp>
#include <dtrain/error.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace data {

namespace detail {
void check_same_fields(const std::vector<Fields>& samples);
Fields stack_fields(const std::vector<Fields>& samples, const std::string& skip = {});
}  // namespace detail

/// Stacks every field of the samples along a new first dimension (all samples' shapes equal).
struct stack {
  Fields operator()(const std::vector<Fields>& samples) const { return detail::stack_fields(samples); }
};

/// Pads field `field` (1-D per sample, [length_i]) to the longest length in the batch with `pad`,
/// adds `mask` ([batch, longest], int64: 1 for a real element, 0 for padding), and stacks the other
/// fields. Samples longer than `max_length` (when > 0) are cut to it.
struct pad_to_longest {
  std::string field;
  std::int64_t pad = 0;
  std::string mask = "attention_mask";
  std::int64_t max_length = 0;

  explicit pad_to_longest(std::string field_name, std::int64_t pad_value = 0, std::string mask_name = "attention_mask",
                          std::int64_t max_len = 0);

  Fields operator()(const std::vector<Fields>& samples) const;
};

}  // namespace data

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/data/impl/collate.ipp>
#endif
