#pragma once
// A rank's batches of a dataset for one epoch, as a range-v3 view.

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include <range/v3/view/iota.hpp>
#include <range/v3/view/transform.hpp>
#include <torch/types.h>

#include <dtrain/data/dataset.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace data {

/// The batches of `split` at `indices` (this rank's sample order for the epoch), `batch_size` at a
/// time, the last one shorter when batch_size does not divide the count. A view: each batch is
/// gathered (index_select) when the iterator reaches it, and the view owns the indices.
template <RandomAccess Split>
auto batches(const Split& split, std::vector<std::int64_t> indices, std::int64_t batch_size) {
  if (batch_size < 1) throw ConfigError("batch size must be at least 1, got " + std::to_string(batch_size));
  auto order = std::make_shared<const std::vector<std::int64_t>>(std::move(indices));
  const auto count = static_cast<std::int64_t>(order->size());
  const std::int64_t n_batches = (count + batch_size - 1) / batch_size;
  return ranges::views::iota(std::int64_t{0}, n_batches) |
         ranges::views::transform([&split, order, batch_size, count](std::int64_t b) -> Batch {
           const std::int64_t begin = b * batch_size, len = std::min(batch_size, count - begin);
           // from_blob does not copy; index_select reads it before `order` can go away.
           const auto idx = torch::from_blob(const_cast<std::int64_t*>(order->data() + begin), {len}, torch::kInt64);
           return split.get_batch(idx);
         });
}

}  // namespace data

DTRAIN_NAMESPACE_END
