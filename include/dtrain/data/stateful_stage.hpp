// SPDX-License-Identifier: Apache-2.0
#pragma once
// A pipeline stage over a class (Ray Data's map_batches with a callable class): the class is
// constructed with the user's arguments (load a model there), lazily, in the process that runs the
// pipeline, at most `concurrency` times, and its instances are then called on collated batches of
// at most `batch_size` rows. `data::map_batches<C>(StageOptions, args...)` in pipeline.hpp builds
// one; docs/data.md ("A model in the pipeline") shows it.
//
// - Construction: on the first batch that finds no idle instance while fewer than `concurrency`
//   exist (so a pipeline built in the driver constructs nothing there; a worker that runs it does).
//   An instance is never copied nor moved afterwards. Each is constructed from const copies of the
//   arguments given to map_batches, so every instance gets the same ones.
// - Sharing: a Pipelined dataset's copies (the loader threads', a Subset's) share the instances; a
//   loader thread takes an idle instance for one batch, waits while all `concurrency` are busy. An
//   instance is used by one thread at a time, so its operator() may change the instance's members.
// - Chunks: with batch_size > 0, a batch of more rows is cut along dim 0 of every field into chunks
//   of batch_size rows (the last one shorter), each chunk one call; the calls' outputs are joined
//   along dim 0 (every chunk must return the same field names). batch_size 0: one call per batch.
// - Inference: each call runs under c10::InferenceMode (no autograd recording, no version counter
//   bumps). Tensors the call creates are inference tensors, which autograd refuses to save for
//   backward ("Inference tensors cannot be saved for backward"): a Linear trained on such an
//   "embedding" column would throw. So every output tensor that is an inference tensor leaves the
//   stage as a normal copy made outside inference mode (joining chunks is that copy already); the
//   cost is one copy of the new columns, small beside the model that made them. Columns passed
//   through untouched are not copied.
// - Device: the instance runs where its arguments put it: pass a torch::Device (ctx.device() when
//   the pipeline is built inside the train loop) and move the model and the batch there.
// - Randomness: a constructor and a call draw from generators of their own, never from LibTorch's
//   default generator, which the training step's dropout draws from on another thread at the same
//   time (detail/generator_scope.hpp says how). Every instance's constructor draws from a generator
//   seeded with the pipeline's seed and the stage's place in it, so all instances of a stage are
//   equal, whichever thread builds them and whenever, in a first run as after a restart; a call
//   draws from one seeded with (the pipeline's seed, the epoch, the batch's first sample, the stage).
// - Errors: an exception from the constructor or a call is rethrown as DataError naming the stage
//   (StageOptions::name, default the class's name), the rows (the samples' indices) and the
//   original message. A constructor that threw is not run again: every later batch rethrows its
//   error.

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <dtrain/data/fields.hpp>
#include <dtrain/detail/type_name.hpp>
#include <dtrain/error.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace data {

/// How a stage over a class runs: `data::map_batches<C>({.concurrency = 2, .batch_size = 64,
/// .name = "clip"}, args...)`.
struct StageOptions {
  /// Instances of the class at most, each used by one loader thread at a time (1 or more).
  int concurrency = 1;
  /// Rows per call at most (0: the whole collated batch in one call).
  std::int64_t batch_size = 0;
  /// The stage's name in error messages (empty: the class's demangled name).
  std::string name;
};

namespace detail {
class StagePool;
}

/// A map_batches stage over a class: copies share one pool of instances (see the header's comment).
class StatefulStage {
 public:
  /// An instance of the class, type-erased, and a call of one on a batch.
  using Factory = std::function<std::shared_ptr<void>()>;
  using Call = std::function<Fields(void*, Fields)>;

  StatefulStage(StageOptions options, const std::string& class_name, Factory make, Call call);

  /// A stage over C, whose instances are C(args...) (args kept as copies).
  template <class C, class... Args>
  static StatefulStage of(StageOptions options, Args&&... args) {
    static_assert(std::is_class_v<C>,
                  "dtrain::data::map_batches<C>(options, args...): C must be a class (constructed once per "
                  "instance, then called on batches); for a function write data::map_batches(f)");
    static_assert(std::is_constructible_v<C, const std::decay_t<Args>&...>,
                  "dtrain::data::map_batches<C>(options, args...): C is not constructible from the arguments "
                  "after the options (each instance is built as C(args...) from const copies of them): pass "
                  "the arguments of one of C's constructors");
    static_assert(std::is_invocable_r_v<Fields, C&, Fields>,
                  "dtrain::data::map_batches<C>(options, args...): C is not callable on a batch: give it "
                  "`dtrain::data::Fields operator()(dtrain::data::Fields batch)` returning the batch's new fields");
    if constexpr (std::is_constructible_v<C, const std::decay_t<Args>&...> && std::is_invocable_r_v<Fields, C&, Fields>) {
      auto saved = std::make_shared<std::tuple<std::decay_t<Args>...>>(std::forward<Args>(args)...);
      Factory make = [saved]() -> std::shared_ptr<void> {
        return std::apply([](const auto&... a) { return std::make_shared<C>(a...); }, std::as_const(*saved));
      };
      Call call = [](void* instance, Fields batch) -> Fields { return Fields((*static_cast<C*>(instance))(std::move(batch))); };
      return StatefulStage(std::move(options), dtrain::detail::type_name<C>(), std::move(make), std::move(call));
    } else {
      return StatefulStage(std::move(options), {}, {}, {});  // not reached: the static_assert above stops the build
    }
  }

  /// The seeds of a stage's generators (see the header's comment): its instances' constructors'
  /// and this batch's calls'.
  struct Seeds {
    std::uint64_t construct = 0;
    std::uint64_t call = 0;
  };

  /// The stage run on `batch`, whose rows are the samples `rows` (their indices in the source;
  /// when an earlier stage changed the row count, `first` alone: the batch's first sample).
  Fields operator()(Fields batch, const std::vector<std::int64_t>& rows, std::int64_t first, Seeds seeds) const;

  const StageOptions& options() const;
  /// The instances constructed so far (at most options().concurrency).
  std::size_t instances() const;

 private:
  std::shared_ptr<detail::StagePool> pool_;
};

namespace detail {

/// The instances of a StatefulStage and who holds them (thread-safe; shared by the stage's copies).
class StagePool {
 public:
  StagePool(StageOptions options, StatefulStage::Factory make, StatefulStage::Call call)
      : options_(std::move(options)), make_(std::move(make)), call_(std::move(call)) {}

  /// Describes the rows of a batch or chunk for an error message; called only when one is thrown.
  using Rows = std::function<std::string()>;

  /// An idle instance, or a new one (constructed under a generator seeded with `construct_seed`)
  /// while fewer than `concurrency` exist, or the next one freed. `rows` describes the batch, for
  /// the constructor's error.
  void* acquire(const Rows& rows, std::uint64_t construct_seed);
  void release(void* instance);
  /// One call under InferenceMode; an exception becomes a DataError naming the stage and `rows`.
  Fields call(void* instance, Fields chunk, const Rows& rows) const;

  const StageOptions& options() const { return options_; }
  std::size_t instances() const;

 private:
  StageOptions options_;
  StatefulStage::Factory make_;
  StatefulStage::Call call_;
  mutable std::mutex mutex_;
  std::condition_variable freed_;
  std::vector<std::shared_ptr<void>> all_;  // every instance constructed
  std::vector<void*> idle_;
  int constructing_ = 0;
  std::exception_ptr failed_;  // a constructor's DataError: every later batch rethrows it
};

/// "rows 4, 9, 12" (at most 8 listed, then how many in all), or "N rows from sample F" when the
/// rows' indices are not known.
std::string describe_rows(const std::vector<std::int64_t>& rows, std::size_t from, std::size_t count, std::int64_t first);

}  // namespace detail

}  // namespace data

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/data/impl/stateful_stage.ipp>
#endif
