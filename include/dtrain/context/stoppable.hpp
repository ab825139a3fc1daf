// SPDX-License-Identifier: Apache-2.0
#pragma once
// The ranges that ctx.epochs(n) and ctx.shard(...) return: each ends early once the run is being
// stopped, so a loop built on them stops at the next step without asking ctx.should_stop() (as a
// Ray Train loop never asks). The question is put at each batch boundary and before each epoch,
// and only while there is work left: a loop that ran out of work before the stop is not cut.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <iterator>
#include <optional>
#include <type_traits>
#include <utility>

#include <dtrain/version.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace detail {

/// The elements of `Range` until `stop()` answers true. `stop` is asked before each element, once
/// per comparison with the end, and only while `Range` has one left. An input range: iterate it
/// once, and do not move it while iterating.
template <class Range>
class until_stopped {
  // Members, as a range-for calls them: data::prefetched's move-only iterator is no range-v3 one.
  using inner = decltype(std::declval<Range&>().begin());
  using inner_end = decltype(std::declval<Range&>().end());

 public:
  until_stopped(Range range, std::function<bool()> stop) : range_(std::move(range)), stop_(std::move(stop)) {}
  until_stopped(until_stopped&&) noexcept = default;
  until_stopped& operator=(until_stopped&&) noexcept = default;

  class iterator {
   public:
    using value_type = std::remove_cvref_t<decltype(*std::declval<inner&>())>;
    using difference_type = std::ptrdiff_t;

    iterator() = default;
    explicit iterator(until_stopped* r) : r_(r), it_(r->range_.begin()), end_(r->range_.end()) {}
    decltype(auto) operator*() const { return **it_; }
    iterator& operator++() {
      ++*it_;
      return *this;
    }
    void operator++(int) { ++*this; }
    friend bool operator==(const iterator& i, std::default_sentinel_t) { return i.at_end(); }

   private:
    bool at_end() const { return *it_ == *end_ || r_->stop_(); }
    until_stopped* r_ = nullptr;
    std::optional<inner> it_;  // optional: a view's iterator need not be default-constructible
    std::optional<inner_end> end_;
  };

  iterator begin() { return iterator(this); }
  std::default_sentinel_t end() const { return {}; }

 private:
  Range range_;
  std::function<bool()> stop_;
};

/// Epochs `first` .. `last` - 1 until `stop()` answers true, asked before each epoch that is left.
/// `begin(e)` runs when the loop takes epoch e (it sets the epoch the Sampler draws from).
class epochs_until_stopped {
 public:
  epochs_until_stopped(std::int64_t first, std::int64_t last, std::function<void(std::int64_t)> begin,
                       std::function<bool()> stop);

  class iterator {
   public:
    using value_type = std::int64_t;
    using difference_type = std::ptrdiff_t;

    iterator() = default;
    iterator(const epochs_until_stopped* r, std::int64_t e) : r_(r), e_(e) {}
    std::int64_t operator*() const {
      if (begun_ != e_) {  // once per epoch, however often the loop reads it
        r_->begin_(e_);
        begun_ = e_;
      }
      return e_;
    }
    iterator& operator++() {
      ++e_;
      return *this;
    }
    void operator++(int) { ++e_; }
    friend bool operator==(const iterator& i, std::default_sentinel_t) { return i.at_end(); }

   private:
    bool at_end() const { return e_ >= r_->last_ || r_->stop_(); }
    const epochs_until_stopped* r_ = nullptr;
    std::int64_t e_ = 0;
    mutable std::int64_t begun_ = -1;
  };

  iterator begin() const { return iterator(this, first_); }
  std::default_sentinel_t end() const { return {}; }

 private:
  std::int64_t first_, last_;
  std::function<void(std::int64_t)> begin_;
  std::function<bool()> stop_;
};

}  // namespace detail

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/context/impl/stoppable.ipp>
#endif
