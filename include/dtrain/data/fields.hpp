// SPDX-License-Identifier: Apache-2.0
#pragma once
// data::Fields, a batch of named tensors, and the two operations every batch type offers
// (batch_size, to_device), so that a batch of (data, target) and a batch of fields flow through
// the same code: ctx.shard, the prefetcher, the Predictor.

#include <concepts>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include <torch/data/example.h>
#include <torch/types.h>

#include <dtrain/error.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace data {

/// Named tensors in the order they were added, the first dimension of each the batch:
/// `b["input_ids"]`, `b["attention_mask"]`, `b["label"]`. Looking up a missing name throws
/// DataError naming it and the names present.
class Fields {
 public:
  using entry = std::pair<std::string, torch::Tensor>;

  Fields() = default;
  Fields(std::initializer_list<entry> entries) {
    for (const auto& [name, tensor] : entries) set(name, tensor);
  }

  /// Adds `name`, or replaces its tensor when it is there already (keeping its place).
  Fields& set(const std::string& name, torch::Tensor tensor);
  /// Removes `name` when it is there; returns whether it was.
  bool erase(const std::string& name);

  bool contains(const std::string& name) const { return find(name) != nullptr; }
  const torch::Tensor& operator[](const std::string& name) const { return at(name); }
  torch::Tensor& operator[](const std::string& name) { return const_cast<torch::Tensor&>(at(name)); }
  const torch::Tensor& at(const std::string& name) const;

  /// The samples in the batch: the first dimension of the first field (0 when there is none).
  std::int64_t size() const;
  std::size_t field_count() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  std::vector<std::string> names() const;

  /// Every field on `device` (a copy where it is elsewhere; `non_blocking` from pinned memory).
  Fields to(torch::Device device, bool non_blocking = false) const;

  auto begin() { return entries_.begin(); }
  auto end() { return entries_.end(); }
  auto begin() const { return entries_.begin(); }
  auto end() const { return entries_.end(); }

 private:
  const torch::Tensor* find(const std::string& name) const {
    for (const auto& [n, t] : entries_)
      if (n == name) return &t;
    return nullptr;
  }
  std::string names_text() const;

  std::vector<entry> entries_;
};

/// @name The batch customisation points
/// A batch type offers `batch_size(b)` (its sample count) and `for_each_tensor(b, f)` (f applied to
/// each of its tensors, in a fixed order, in place). data::Example<> and Fields have them; a type
/// of your own gets them as free functions found by argument-dependent lookup, or as members
/// `size()` and `for_each_tensor(f)`.
/// @{
std::int64_t batch_size(const torch::data::Example<>& b);
inline std::int64_t batch_size(const Fields& b) { return b.size(); }

template <class F>
void for_each_tensor(torch::data::Example<>& b, F&& f) {
  f(b.data);
  f(b.target);
}
template <class F>
void for_each_tensor(Fields& b, F&& f) {
  for (auto& e : b) f(e.second);
}
/// @}

namespace detail {
struct tensor_visitor {
  void operator()(torch::Tensor&) const {}
};
template <class B>
concept free_batch_ops = requires(const B& cb, B& b, tensor_visitor f) {
  { batch_size(cb) } -> std::convertible_to<std::int64_t>;
  for_each_tensor(b, f);
};
template <class B>
concept member_batch_ops = requires(const B& cb, B& b, tensor_visitor f) {
  { cb.size() } -> std::convertible_to<std::int64_t>;
  b.for_each_tensor(f);
};
}  // namespace detail

/// What a batch is: copyable, with a sample count and its tensors reachable one by one.
/// Models: torch::data::Example<> (data, target), data::Fields.
template <class B>
concept BatchType = std::copy_constructible<B> && (detail::free_batch_ops<B> || detail::member_batch_ops<B>);

namespace detail {
template <BatchType B>
std::int64_t size_of_batch(const B& b) {
  if constexpr (free_batch_ops<B>) return batch_size(b);
  else return static_cast<std::int64_t>(b.size());
}
template <BatchType B, class F>
void each_tensor(B& b, F&& f) {
  if constexpr (free_batch_ops<B>) for_each_tensor(b, f);
  else b.for_each_tensor(f);
}
}  // namespace detail

/// `b` with each tensor on `device` (defined tensors only; `non_blocking` from pinned memory).
template <BatchType B>
B to_device(B b, torch::Device device, bool non_blocking = false) {
  detail::each_tensor(b, [&](torch::Tensor& t) {
    if (t.defined()) t = t.to(device, non_blocking);
  });
  return b;
}

/// The sample count of any BatchType.
template <BatchType B>
std::int64_t samples_in(const B& b) {
  return detail::size_of_batch(b);
}

static_assert(BatchType<Fields>);
static_assert(BatchType<torch::data::Example<>>);

}  // namespace data

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/data/impl/fields.ipp>
#endif
