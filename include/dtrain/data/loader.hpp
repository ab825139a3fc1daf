// SPDX-License-Identifier: Apache-2.0
#pragma once
// data::loaded_batches: a rank's batches gathered by N loader threads ahead of the training step,
// handed out in the epoch's order whatever the thread count.

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include <torch/types.h>

#include <dtrain/data/dataset.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace data {

/// Called with a batch's index in the epoch and its sample count when the batch is handed out.
using BatchObserver = std::function<void(std::int64_t index, std::int64_t samples)>;

/// A dataset that wants its batches gathered on loader threads: `loader_threads()` of them (0:
/// on the training thread), see data::Pipelined.
template <class D>
concept ThreadedLoading = RandomAccess<D> && requires(const D& d) {
  { d.loader_threads() } -> std::convertible_to<int>;
};

/// The batch of `split` at `indices`, in epoch `epoch` when the dataset draws per epoch (a
/// pipeline's random transforms): `get_batch(indices, epoch)` where it has one.
template <RandomAccess Split>
batch_of<Split> gather(const Split& split, const torch::Tensor& indices, std::int64_t epoch) {
  if constexpr (requires { { split.get_batch(indices, epoch) } -> std::convertible_to<batch_of<Split>>; })
    return split.get_batch(indices, epoch);
  else
    return split.get_batch(indices);
}

/// The batches `first` .. of `split` at `order`, `batch_size` at a time, each computed by one of
/// `split.loader_threads()` threads at most `kBatchesAheadPerThread` per thread ahead of the one the
/// loop holds. Batch b depends only on its indices and the epoch, never on the thread that gathers
/// it, so any thread count yields the same batches in the same order. An input range (iterate it
/// once); leaving the loop early stops and joins the threads. A loader thread's exception is thrown
/// from the iterator when its batch's turn comes.
template <ThreadedLoading Split>
class loaded_batches {
 public:
  using batch = batch_of<Split>;
  static constexpr std::int64_t kBatchesAheadPerThread = 2;

  loaded_batches(const Split& split, std::vector<std::int64_t> order, std::int64_t batch_size, std::int64_t first,
                 BatchObserver observe, std::int64_t epoch)
      : s_(std::make_unique<state>()) {
    s_->split = &split;
    s_->order = std::move(order);
    s_->batch_size = batch_size;
    s_->count = static_cast<std::int64_t>(s_->order.size());
    s_->n_batches = (s_->count + batch_size - 1) / batch_size;
    s_->first = std::clamp<std::int64_t>(first, 0, s_->n_batches);
    s_->next = s_->first;
    s_->observe = std::move(observe);
    s_->epoch = epoch;
    s_->threads = std::max(0, static_cast<int>(split.loader_threads()));
  }
  loaded_batches(loaded_batches&&) noexcept = default;
  loaded_batches& operator=(loaded_batches&&) noexcept = default;
  ~loaded_batches() {
    if (s_) s_->stop_all();
  }

  class iterator {
   public:
    using value_type = batch;
    using difference_type = std::ptrdiff_t;
    using iterator_concept = std::input_iterator_tag;
    using iterator_category = std::input_iterator_tag;

    iterator() = default;
    explicit iterator(loaded_batches* r) : r_(r) { fetch(); }
    const batch& operator*() const { return *current_; }
    iterator& operator++() {
      fetch();
      return *this;
    }
    void operator++(int) { fetch(); }
    friend bool operator==(const iterator& i, std::default_sentinel_t) { return !i.current_; }

   private:
    void fetch() {
      current_.reset();
      if (auto b = r_->s_->take()) current_.emplace(std::move(*b));
    }
    loaded_batches* r_ = nullptr;
    std::optional<batch> current_;
  };

  iterator begin() {
    s_->start();
    return iterator(this);
  }
  std::default_sentinel_t end() const { return {}; }
  /// The batches this range hands out in all (from `first` on).
  std::int64_t size() const { return s_->n_batches - s_->first; }

 private:
  struct state {
    const Split* split = nullptr;
    std::vector<std::int64_t> order;
    std::int64_t batch_size = 1, count = 0, n_batches = 0, first = 0, next = 0, epoch = 0;
    int threads = 0;
    BatchObserver observe;
    std::mutex m;
    std::condition_variable cv;
    std::map<std::int64_t, std::variant<batch, std::exception_ptr>> ready;
    bool stopping = false, started = false;
    std::vector<std::thread> workers;

    std::int64_t length(std::int64_t b) const { return std::min(batch_size, count - b * batch_size); }
    batch compute(std::int64_t b) {
      // from_blob does not copy; the order outlives every gather.
      const auto idx = torch::from_blob(order.data() + b * batch_size, {length(b)}, torch::kInt64);
      return gather(*split, idx, epoch);
    }
    void start() {
      if (started) return;
      started = true;
      for (int t = 0; t < threads; ++t) workers.emplace_back([this, t] { work(t); });
    }
    void work(int t) {
      for (std::int64_t b = first + t; b < n_batches; b += threads) {
        {
          std::unique_lock lock(m);
          cv.wait(lock, [&] { return stopping || b < next + kBatchesAheadPerThread * threads; });
          if (stopping) return;
        }
        std::variant<batch, std::exception_ptr> out = std::exception_ptr();
        try {
          out.template emplace<0>(compute(b));
        } catch (...) {
          out = std::current_exception();
        }
        std::lock_guard lock(m);
        ready.emplace(b, std::move(out));
        cv.notify_all();
      }
    }
    std::optional<batch> take() {
      if (next >= n_batches) return std::nullopt;
      const std::int64_t b = next;
      std::optional<batch> out;
      if (threads == 0) {
        out.emplace(compute(b));
      } else {
        std::unique_lock lock(m);
        cv.wait(lock, [&] { return ready.count(b) > 0; });
        auto node = ready.extract(b);
        ++next;
        cv.notify_all();
        lock.unlock();
        if (auto* e = std::get_if<std::exception_ptr>(&node.mapped())) std::rethrow_exception(*e);
        out.emplace(std::move(std::get<batch>(node.mapped())));
        if (observe) observe(b, length(b));
        return out;
      }
      ++next;
      if (observe) observe(b, length(b));
      return out;
    }
    void stop_all() {
      {
        std::lock_guard lock(m);
        stopping = true;
      }
      cv.notify_all();
      for (auto& w : workers) w.join();
      workers.clear();
    }
  };
  std::unique_ptr<state> s_;
};

}  // namespace data

DTRAIN_NAMESPACE_END
