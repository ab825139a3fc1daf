// SPDX-License-Identifier: Apache-2.0
#pragma once
// data::prefetch: hands out batch i while batch i+1 is already on its way to the device.

#include <cstddef>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>

#include <range/v3/range/access.hpp>
#include <torch/types.h>

#include <dtrain/data/dataset.hpp>
#include <dtrain/detail/cuda.hpp>

#if DTRAIN_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

DTRAIN_NAMESPACE_BEGIN

namespace data {

/// A Transfer moves a batch to a device in two halves: start(batch) begins the move and returns
/// a pending value; finish(pending) makes the batch usable by the caller's stream and returns it.
/// Between the two the train loop works on the previous batch. `B` is the batch type (data::Batch,
/// data::Fields, any BatchType).
template <class T, class B = Batch>
concept Transfer = requires(T& t, B b) {
  { t.finish(t.start(std::move(b))) } -> std::convertible_to<B>;
};

/// The CPU's Transfer: batches stay where they are.
struct no_transfer {
  template <BatchType B>
  B start(B b) const {
    return b;
  }
  template <BatchType B>
  B finish(B b) const {
    return b;
  }
};

/// The batch type a range of batches yields.
template <class Range>
using range_batch = std::remove_cvref_t<decltype(*ranges::begin(std::declval<Range&>()))>;

/// The batches of `Range` in order, one transfer ahead: when batch i is handed out, batch i+1 has
/// been produced and its transfer started. `on_yield` (optional) runs each time a batch is handed
/// out, so that whoever counts consumed batches (the sampler position a checkpoint saves) counts
/// those the loop received, not those the prefetcher read ahead.
template <class Range, Transfer<range_batch<Range>> Xfer>
class prefetched {
  using batch_type = range_batch<Range>;

 public:
  prefetched(Range range, Xfer transfer, std::function<void()> on_yield = {})
      : range_(std::move(range)), transfer_(std::move(transfer)), on_yield_(std::move(on_yield)) {}

  class iterator {
    using inner = decltype(ranges::begin(std::declval<Range&>()));
    using inner_end = decltype(ranges::end(std::declval<Range&>()));
    using pending = decltype(std::declval<Xfer&>().start(std::declval<batch_type>()));

   public:
    using value_type = batch_type;
    using difference_type = std::ptrdiff_t;
    using iterator_concept = std::input_iterator_tag;
    using iterator_category = std::input_iterator_tag;

    iterator() = default;
    explicit iterator(prefetched* p) : p_(p), it_(ranges::begin(p->range_)), end_(ranges::end(p->range_)) {
      start_next();
      advance();
    }
    iterator(iterator&&) = default;
    iterator& operator=(iterator&&) = default;

    const batch_type& operator*() const { return *current_; }
    iterator& operator++() {
      advance();
      return *this;
    }
    void operator++(int) { advance(); }
    friend bool operator==(const iterator& i, std::default_sentinel_t) { return !i.current_; }

   private:
    void start_next() {
      if (*it_ == *end_) return;
      next_.emplace(p_->transfer_.start(batch_type(**it_)));
      ++*it_;
    }
    void advance() {
      if (!next_) {
        current_.reset();
        return;
      }
      current_.emplace(p_->transfer_.finish(std::move(*next_)));
      next_.reset();
      start_next();  // the next batch moves while the caller trains on this one
      if (p_->on_yield_) p_->on_yield_();
    }

    prefetched* p_ = nullptr;
    std::optional<inner> it_;
    std::optional<inner_end> end_;
    std::optional<pending> next_;
    std::optional<batch_type> current_;

    friend class prefetched;
  };

  iterator begin() { return iterator(this); }
  std::default_sentinel_t end() const { return {}; }

 private:
  Range range_;
  Xfer transfer_;
  std::function<void()> on_yield_;
};

/// `range`'s batches, each moved by `transfer` one batch ahead of use.
template <class Range, Transfer<range_batch<Range>> Xfer>
prefetched<Range, Xfer> prefetch(Range range, Xfer transfer, std::function<void()> on_yield = {}) {
  return {std::move(range), std::move(transfer), std::move(on_yield)};
}

#if DTRAIN_WITH_CUDA
/// Batches to one CUDA device: copied into pinned host memory, then to the device on a copy
/// stream of their own (non-blocking, so it overlaps the compute stream's kernels); an event hands
/// each batch to the compute stream, which waits for it on the device, not on the host.
class cuda_transfer {
 public:
  explicit cuda_transfer(torch::Device device)
      : device_(device), copy_(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index())) {}

  template <BatchType B>
  struct pending {
    B batch;
    std::shared_ptr<dtrain::detail::cuda_event> ready;
  };

  template <BatchType B>
  pending<B> start(B b) {
    c10::cuda::CUDAGuard on_device(device_);
    c10::cuda::CUDAStreamGuard on_copy_stream(copy_);
    data::detail::each_tensor(b, [&](torch::Tensor& t) { t = to_device(t); });
    pending<B> p{std::move(b), std::make_shared<dtrain::detail::cuda_event>()};
    p.ready->record(copy_);
    return p;
  }

  template <BatchType B>
  B finish(pending<B> p) {
    const auto compute = c10::cuda::getCurrentCUDAStream(device_.index());
    p.ready->block(compute);
    // Allocated on the copy stream, used on the compute stream: the caching allocator must not
    // give the memory to the copy stream again before the compute stream is done with it.
    data::detail::each_tensor(p.batch, [&](torch::Tensor& t) {
      if (t.defined() && t.is_cuda()) c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), compute);
    });
    return std::move(p.batch);
  }

 private:
  torch::Tensor to_device(const torch::Tensor& t) const {
    if (!t.defined() || t.is_cuda()) return t;
    // From pinned memory the copy is a DMA that does not block the host.
    const auto pinned = t.is_pinned() ? t : t.contiguous().pin_memory();
    return pinned.to(device_, /*non_blocking=*/true);
  }

  torch::Device device_;
  c10::cuda::CUDAStream copy_;
};
#endif

}  // namespace data

DTRAIN_NAMESPACE_END
