// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of stateful_stage.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <c10/core/InferenceMode.h>

#include <algorithm>

#include <dtrain/data/stateful_stage.hpp>
#include <dtrain/detail/generator_scope.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace data {

namespace detail {

DTRAIN_INLINE std::string describe_rows(const std::vector<std::int64_t>& rows, std::size_t from, std::size_t count,
                                        std::int64_t first) {
  if (count == 0) return "an empty batch (from sample " + std::to_string(first) + ")";
  if (from + count > rows.size())
    return std::to_string(count) + " rows from sample " + std::to_string(first) + " on";
  constexpr std::size_t kListed = 8;
  std::string out = count == 1 ? "row " : "rows ";
  for (std::size_t k = 0; k < std::min(count, kListed); ++k) out += (k ? ", " : "") + std::to_string(rows[from + k]);
  if (count > kListed) out += ", ... (" + std::to_string(count) + " rows, the last " + std::to_string(rows[from + count - 1]) + ")";
  return out;
}

DTRAIN_INLINE void* StagePool::acquire(const Rows& rows, std::uint64_t construct_seed) {
  std::unique_lock lock(mutex_);
  for (;;) {
    if (failed_) std::rethrow_exception(failed_);
    if (!idle_.empty()) {
      void* instance = idle_.back();
      idle_.pop_back();
      return instance;
    }
    if (all_.size() + static_cast<std::size_t>(constructing_) < static_cast<std::size_t>(options_.concurrency)) break;
    freed_.wait(lock);
  }
  ++constructing_;  // constructed outside the lock: the other instances stay usable meanwhile
  lock.unlock();
  std::shared_ptr<void> made;
  std::exception_ptr error;
  try {
    dtrain::detail::GeneratorScope own_generator(construct_seed);
    made = make_();
  } catch (const std::exception& e) {
    error = std::make_exception_ptr(DataError("map_batches stage \"" + options_.name + "\": its constructor threw (building an instance for " +
                                              rows() + "): " + e.what() +
                                              "; it is not run again: every later batch of this stage throws this error"));
  } catch (...) {
    error = std::make_exception_ptr(DataError("map_batches stage \"" + options_.name + "\": its constructor threw (building an instance for " +
                                              rows() + ") something that is not a std::exception" +
                                              "; it is not run again: every later batch of this stage throws this error"));
  }
  lock.lock();
  --constructing_;
  if (error) {
    if (!failed_) failed_ = error;
    freed_.notify_all();  // the threads waiting for an instance get the error too
    std::rethrow_exception(failed_);
  }
  all_.push_back(made);
  return made.get();
}

DTRAIN_INLINE void StagePool::release(void* instance) {
  {
    std::lock_guard lock(mutex_);
    idle_.push_back(instance);
  }
  freed_.notify_one();
}

DTRAIN_INLINE std::size_t StagePool::instances() const {
  std::lock_guard lock(mutex_);
  return all_.size();
}

DTRAIN_INLINE Fields StagePool::call(void* instance, Fields chunk, const Rows& rows) const {
  Fields out;
  try {
    c10::InferenceMode inference;
    out = call_(instance, std::move(chunk));
  } catch (const std::exception& e) {
    throw DataError("map_batches stage \"" + options_.name + "\" threw on " + rows() + ": " + e.what());
  } catch (...) {
    throw DataError("map_batches stage \"" + options_.name + "\" threw on " + rows() + " something that is not a std::exception");
  }
  return out;
}

}  // namespace detail

DTRAIN_INLINE StatefulStage::StatefulStage(StageOptions options, const std::string& class_name, Factory make, Call call) {
  if (options.name.empty()) options.name = class_name.empty() ? "map_batches stage" : class_name;
  if (options.concurrency < 1)
    throw ConfigError("map_batches stage \"" + options.name + "\": StageOptions::concurrency must be 1 or more, got " +
                      std::to_string(options.concurrency));
  if (options.batch_size < 0)
    throw ConfigError("map_batches stage \"" + options.name + "\": StageOptions::batch_size must be 0 (the whole batch) or more, got " +
                      std::to_string(options.batch_size));
  pool_ = std::make_shared<detail::StagePool>(std::move(options), std::move(make), std::move(call));
  dtrain::detail::GeneratorScope::prepare();  // here, usually before any loader thread runs
}

DTRAIN_INLINE const StageOptions& StatefulStage::options() const { return pool_->options(); }
DTRAIN_INLINE std::size_t StatefulStage::instances() const { return pool_->instances(); }

DTRAIN_INLINE Fields StatefulStage::operator()(Fields batch, const std::vector<std::int64_t>& rows, std::int64_t first,
                                               Seeds seeds) const {
  auto& pool = *pool_;
  const auto& name = pool.options().name;
  const auto n = batch.size();
  const auto per = pool.options().batch_size > 0 ? pool.options().batch_size : n;
  const std::vector<std::int64_t> unknown;
  const auto& known = static_cast<std::size_t>(n) == rows.size() ? rows : unknown;
  const auto describe = [&](std::int64_t from, std::int64_t count) {
    return detail::describe_rows(known, static_cast<std::size_t>(from), static_cast<std::size_t>(count),
                                 known.empty() ? first : known[static_cast<std::size_t>(from)]);
  };

  void* instance = pool.acquire([&] { return describe(0, n); }, seeds.construct);
  struct Release {
    detail::StagePool& pool;
    void* instance;
    ~Release() { pool.release(instance); }
  } release{pool, instance};

  // The batch's calls draw from their own generator, in order on this thread (see the header).
  dtrain::detail::GeneratorScope own_generator(seeds.call);
  std::vector<Fields> outs;
  if (n <= per) {
    outs.push_back(pool.call(instance, std::move(batch), [&] { return describe(0, n); }));
  } else {
    for (const auto& [field, t] : batch)
      if (t.dim() == 0 || t.size(0) != n)
        throw DataError("map_batches stage \"" + name + "\": field \"" + field + "\" has " +
                        (t.dim() == 0 ? std::string("no dimension") : std::to_string(t.size(0)) + " rows") +
                        " where the batch has " + std::to_string(n) +
                        ": StageOptions::batch_size cuts every field along its first dimension (batch_size 0 does not cut)");
    for (std::int64_t from = 0; from < n; from += per) {
      const auto count = std::min(per, n - from);
      Fields chunk;
      for (const auto& [field, t] : batch) chunk.set(field, t.narrow(0, from, count));
      outs.push_back(pool.call(instance, std::move(chunk), [&] { return describe(from, count); }));
    }
  }
  if (outs.size() == 1) {
    // Inference tensors cannot be saved for backward: a normal copy of each (see the header).
    for (auto& [field, t] : outs[0])
      if (t.defined() && t.is_inference()) t = t.clone();
    return std::move(outs[0]);
  }
  // Joined outside inference mode: torch::cat's outputs are normal tensors.
  const auto names = outs[0].names();
  for (std::size_t k = 1; k < outs.size(); ++k)
    if (outs[k].names() != names) {
      auto list = [](const std::vector<std::string>& v) {
        std::string s;
        for (const auto& x : v) s += (s.empty() ? "\"" : ", \"") + x + "\"";
        return "[" + s + "]";
      };
      const auto from = static_cast<std::int64_t>(k) * per;
      throw DataError("map_batches stage \"" + name + "\" returned the fields " + list(outs[k].names()) + " for " +
                      describe(from, std::min(per, n - from)) + " but " + list(names) + " for " + describe(0, per) +
                      ": every call must return the same fields");
    }
  Fields joined;
  std::vector<torch::Tensor> parts(outs.size());
  for (const auto& field : names) {
    for (std::size_t k = 0; k < outs.size(); ++k) parts[k] = outs[k][field];
    try {
      joined.set(field, torch::cat(parts, 0));
    } catch (const std::exception& e) {
      throw DataError("map_batches stage \"" + name + "\": its outputs' field \"" + field +
                      "\" cannot be joined along dim 0 across the calls of batch_size " + std::to_string(per) + " rows (" +
                      describe(0, n) + "): " + e.what());
    }
  }
  return joined;
}

}  // namespace data
DTRAIN_NAMESPACE_END
