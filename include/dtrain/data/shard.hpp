// SPDX-License-Identifier: Apache-2.0
#pragma once
// A rank's batches of a dataset for one epoch, as a range-v3 view.

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include <range/v3/view/iota.hpp>
#include <range/v3/view/transform.hpp>
#include <torch/types.h>

#include <dtrain/data/dataset.hpp>
#include <dtrain/data/loader.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace data {

/// How many batches of `batch_size` hold `count` samples (the last one may be shorter).
inline std::int64_t batch_count(std::int64_t count, std::int64_t batch_size) {
  return (count + batch_size - 1) / batch_size;
}

/// The batches of `split` at `indices` (this rank's sample order for the epoch), `batch_size` at a
/// time, the last one shorter when batch_size does not divide the count, starting at batch
/// `first` (a resumed epoch skips what it trained already). A view: each batch is gathered
/// (index_select) when the iterator reaches it, and the view owns the indices. `observe`, when
/// set, hears of each batch gathered. `epoch` reaches a dataset with `get_batch(indices, epoch)`
/// (a pipeline's random transforms draw per epoch). The batches are of the dataset's BatchType; a
/// data::ThreadedLoading dataset (a data::Pipelined) is gathered by its loader threads ahead of the
/// loop instead (data::loaded_batches), in the same order.
template <RandomAccess Split>
auto batches(const Split& split, std::vector<std::int64_t> indices, std::int64_t batch_size, std::int64_t first = 0,
             BatchObserver observe = {}, std::int64_t epoch = 0) {
  if (batch_size < 1) throw ConfigError("batch size must be at least 1, got " + std::to_string(batch_size));
  if constexpr (ThreadedLoading<Split>) {
    return loaded_batches<Split>(split, std::move(indices), batch_size, first, std::move(observe), epoch);
  } else {
  auto order = std::make_shared<const std::vector<std::int64_t>>(std::move(indices));
  const auto count = static_cast<std::int64_t>(order->size());
  const std::int64_t n_batches = batch_count(count, batch_size);
  first = std::clamp<std::int64_t>(first, 0, n_batches);
  return ranges::views::iota(first, n_batches) |
         ranges::views::transform([&split, order, batch_size, count, epoch,
                                   observe = std::move(observe)](std::int64_t b) -> batch_of<Split> {
           const std::int64_t begin = b * batch_size, len = std::min(batch_size, count - begin);
           if (observe) observe(b, len);
           // from_blob does not copy; index_select reads it before `order` can go away.
           const auto idx = torch::from_blob(const_cast<std::int64_t*>(order->data() + begin), {len}, torch::kInt64);
           return gather(split, idx, epoch);
         });
  }
}

}  // namespace data

DTRAIN_NAMESPACE_END
