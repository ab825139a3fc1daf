// SPDX-License-Identifier: Apache-2.0
#pragma once
// data::map, filter, collate, map_batches composed with `|`, and data::Pipelined: a source of
// samples run through such a pipeline, a RandomAccess dataset of data::Fields batches that ctx.shard
// gathers on loader threads ahead of the training step.
//
// Randomness: a transform that takes a second argument, `at::Generator&`, gets a generator of
// its own per sample (and per batch, for map_batches), seeded from (the pipeline's seed, the epoch,
// the sample's index); a random operator that a transform calls without a generator draws from
// that generator too, never from LibTorch's default one, which the training step uses
// (detail/generator_scope.hpp). What a sample draws therefore depends neither on the thread that
// loads it, nor on the batch it falls in, nor on how far a resumed epoch had got: any loader thread count
// gives the same batches, and a run killed mid-epoch and resumed draws what it would have drawn.
// The seed is the pipeline's state for a checkpoint: `snapshot.with_object("pipeline",
// ds.random_state())` and `ck.load_object("pipeline", ds.random_state())`.
//
// A stage over a class (a model loaded once, then called on batches): `data::map_batches<C>(
// StageOptions{.concurrency, .batch_size, .name}, args...)`, in stateful_stage.hpp. Its
// constructor and calls draw from generators seeded from the pipeline's seed too (the stage's
// place for the constructor, as above for the calls), never from LibTorch's default generator,
// which the training step uses (stateful_stage.hpp).

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/serialize/archive.h>
#include <torch/types.h>

#include <dtrain/data/collate.hpp>
#include <dtrain/data/dataset.hpp>
#include <dtrain/data/fields.hpp>
#include <dtrain/data/stateful_stage.hpp>
#include <dtrain/detail/generator_scope.hpp>
#include <dtrain/error.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace data {

/// @name Stages
/// @{
/// Each sample becomes f(sample) (or f(sample, generator)).
template <class F>
struct map_stage {
  F f;
};
/// Samples for which p(sample) (or p(sample, generator)) is false are dropped: the batch is that
/// much shorter (batches are never refilled, so they stay the same whatever the thread count).
template <class F>
struct filter_stage {
  F f;
};
/// The batch's samples (a std::vector) become one data::Fields batch: f(samples).
template <class F>
struct collate_stage {
  F f;
};
/// Each collated batch becomes f(batch) (or f(batch, generator)); with F = StatefulStage, an
/// instance of a class called on it (data::map_batches<C>(options, args...)).
template <class F>
struct map_batches_stage {
  F f;
};
/// @}

/// Stages run in order: per-sample stages (map, filter), one collate, then map_batches.
template <class... Stages>
struct pipeline {
  std::tuple<Stages...> stages;
};

template <class F>
pipeline<map_stage<F>> map(F f) {
  return {{map_stage<F>{std::move(f)}}};
}
template <class F>
pipeline<filter_stage<F>> filter(F f) {
  return {{filter_stage<F>{std::move(f)}}};
}
template <class F>
pipeline<collate_stage<F>> collate(F f) {
  return {{collate_stage<F>{std::move(f)}}};
}
// The int&... pack takes no argument: it keeps `map_batches<C>(...)`, C given explicitly, for the
// stage over a class below (`map_batches<C>({})` would otherwise build a C here and copy it).
template <int&... ExplicitArgumentBarrier, class F>
pipeline<map_batches_stage<F>> map_batches(F f) {
  return {{map_batches_stage<F>{std::move(f)}}};
}
/// Each collated batch through an instance of C, constructed as C(args...) once per instance in
/// the process that runs the pipeline: `data::map_batches<Embed>({.concurrency = 2, .batch_size =
/// 64, .name = "clip"}, model_dir)` (stateful_stage.hpp). The pipeline's copies share the instances.
template <class C, class... Args>
pipeline<map_batches_stage<StatefulStage>> map_batches(StageOptions options, Args&&... args) {
  return {{map_batches_stage<StatefulStage>{StatefulStage::of<C>(std::move(options), std::forward<Args>(args)...)}}};
}

template <class... A, class... B>
pipeline<A..., B...> operator|(pipeline<A...> a, pipeline<B...> b) {
  return {std::tuple_cat(std::move(a.stages), std::move(b.stages))};
}

/// The pipeline's seed, saved in a checkpoint as an object (`with_object` / `load_object`).
struct PipelineRandom {
  std::uint64_t seed = 0;
  void save(torch::serialize::OutputArchive& a) const {
    a.write("seed", torch::tensor(static_cast<std::int64_t>(seed), torch::kInt64));
  }
  void load(torch::serialize::InputArchive& a);
};

namespace detail {

// The stream of a map_batches<C> stage's constructors (the batches' streams are 0, 1, 2, ...).
inline constexpr std::uint64_t kConstructStream = 0x636f6e7374727563ULL;

// SplitMix64's finaliser: well-mixed seeds from (seed, epoch, index, stream).
std::uint64_t mix(std::uint64_t x);
std::uint64_t seed_for(std::uint64_t seed, std::int64_t epoch, std::int64_t index, std::uint64_t stream);
at::Generator generator_for(std::uint64_t seed, std::int64_t epoch, std::int64_t index, std::uint64_t stream);

// f(x, g), or f(x): either way a random operator that f calls without a generator draws from g
// too, not from the default generator the training step uses (detail/generator_scope.hpp).
template <class F, class X>
decltype(auto) call(F& f, X&& x, at::Generator& g) {
  dtrain::detail::GeneratorScope own_generator(g);
  if constexpr (std::is_invocable_v<F&, X&&, at::Generator&>) return f(std::forward<X>(x), g);
  else return f(std::forward<X>(x));
}

template <class T>
struct is_collate : std::false_type {};
template <class F>
struct is_collate<collate_stage<F>> : std::true_type {};
template <class T>
struct is_filter : std::false_type {};
template <class F>
struct is_filter<filter_stage<F>> : std::true_type {};
template <class T>
struct is_map_batches : std::false_type {};
template <class F>
struct is_map_batches<map_batches_stage<F>> : std::true_type {};

}  // namespace detail

/// Options of a Pipelined dataset.
struct PipelineOptions {
  /// Threads that gather batches ahead of the loop (0: on the training thread).
  int loader_threads = 2;
  /// The seed of every random transform (see the header's comment); the same on every rank.
  std::uint64_t seed = 0;
};

/// `source` (anything with size() and a sample by index: `row(i)`, or `operator[](i)`) run through
/// `stages`: a RandomAccess dataset whose get_batch gives data::Fields.
template <class Source, class... Stages>
class Pipelined {
  static_assert((detail::is_collate<Stages>::value + ... + 0) == 1,
                "dtrain::data::Pipelined: a pipeline needs exactly one collate stage, between the per-sample "
                "stages (map, filter) and the per-batch ones (map_batches): e.g. "
                "data::map(f) | data::collate(data::stack()) | data::map_batches(g)");

 public:
  Pipelined(Source source, pipeline<Stages...> p, PipelineOptions options = {})
      : source_(std::move(source)), p_(std::move(p)), threads_(options.loader_threads) {
    random_.seed = options.seed;
    dtrain::detail::GeneratorScope::prepare();  // here, before any loader thread runs
    if (threads_ < 0)
      throw ConfigError("PipelineOptions::loader_threads must be 0 or more, got " + std::to_string(threads_));
  }

  std::int64_t size() const { return static_cast<std::int64_t>(source_.size()); }
  int loader_threads() const { return threads_; }
  void set_loader_threads(int n) { threads_ = n < 0 ? 0 : n; }
  const Source& source() const { return source_; }
  PipelineRandom& random_state() { return random_; }
  const PipelineRandom& random_state() const { return random_; }

  Fields get_batch(const torch::Tensor& indices) const { return get_batch(indices, 0); }
  /// The batch of the samples at `indices` in epoch `epoch` (ctx.shard passes the epoch).
  Fields get_batch(const torch::Tensor& indices, std::int64_t epoch) const {
    const auto idx = indices.to(torch::kInt64).contiguous();
    const auto* at = idx.data_ptr<std::int64_t>();
    std::vector<std::int64_t> ids(at, at + idx.numel());
    std::vector<at::Generator> gens;
    gens.reserve(ids.size());
    for (auto i : ids) gens.push_back(detail::generator_for(random_.seed, epoch, i, 0));
    std::vector<decltype(sample(0))> samples;
    samples.reserve(ids.size());
    for (auto i : ids) samples.push_back(sample(i));
    std::vector<std::size_t> alive(ids.size());
    for (std::size_t k = 0; k < alive.size(); ++k) alive[k] = k;
    const std::int64_t first = ids.empty() ? -1 : ids.front();
    return run<0>(std::move(samples), alive, gens, ids, epoch, first);
  }

 private:
  auto sample(std::int64_t i) const {
    if constexpr (requires { source_.row(i); }) return source_.row(i);
    else return source_[i];
  }

  // Per-sample stages on the surviving samples (`alive` maps them to their generators), until the
  // collate stage; then the batch stages.
  template <std::size_t I, class T>
  Fields run(std::vector<T> xs, std::vector<std::size_t>& alive, std::vector<at::Generator>& gens,
             const std::vector<std::int64_t>& ids, std::int64_t epoch, std::int64_t first) const {
    using stage = std::tuple_element_t<I, std::tuple<Stages...>>;
    const auto& st = std::get<I>(p_.stages);
    if constexpr (detail::is_collate<stage>::value) {
      Fields b = st.f(std::as_const(xs));
      std::vector<std::int64_t> rows(alive.size());  // the batch's samples, named by a stage's errors
      for (std::size_t k = 0; k < alive.size(); ++k) rows[k] = ids[alive[k]];
      return run_batch<I + 1>(std::move(b), epoch, first, rows);
    } else if constexpr (detail::is_map_batches<stage>::value) {
      static_assert(!detail::is_map_batches<stage>::value,
                    "dtrain::data pipeline: map_batches comes after collate; put data::collate(...) before it");
      return {};
    } else {
      if constexpr (detail::is_filter<stage>::value) {
        std::vector<T> kept;
        std::vector<std::size_t> kept_alive;
        for (std::size_t k = 0; k < xs.size(); ++k)
          if (detail::call(st.f, std::as_const(xs[k]), gens[alive[k]])) {
            kept.push_back(std::move(xs[k]));
            kept_alive.push_back(alive[k]);
          }
        alive = std::move(kept_alive);
        return run<I + 1>(std::move(kept), alive, gens, ids, epoch, first);
      } else {
        using U = std::decay_t<decltype(detail::call(st.f, std::move(xs[0]), gens[0]))>;
        std::vector<U> ys;
        ys.reserve(xs.size());
        for (std::size_t k = 0; k < xs.size(); ++k) ys.push_back(detail::call(st.f, std::move(xs[k]), gens[alive[k]]));
        return run<I + 1>(std::move(ys), alive, gens, ids, epoch, first);
      }
    }
  }

  template <std::size_t I>
  Fields run_batch(Fields b, std::int64_t epoch, std::int64_t first, const std::vector<std::int64_t>& rows) const {
    if constexpr (I == sizeof...(Stages)) {
      return b;
    } else {
      using stage = std::tuple_element_t<I, std::tuple<Stages...>>;
      static_assert(detail::is_map_batches<stage>::value,
                    "dtrain::data pipeline: after collate only map_batches stages may follow; move map and filter "
                    "before data::collate(...)");
      const auto& st = std::get<I>(p_.stages);
      if constexpr (std::is_same_v<stage, map_batches_stage<StatefulStage>>) {
        // Every instance's constructor: the stage's place alone (epoch -1, index I, its own stream).
        const StatefulStage::Seeds seeds{.construct = detail::seed_for(random_.seed, -1, I, detail::kConstructStream),
                                         .call = detail::seed_for(random_.seed, epoch, first, 1 + I)};
        return run_batch<I + 1>(st.f(std::move(b), rows, first, seeds), epoch, first, rows);
      } else {
        auto g = detail::generator_for(random_.seed, epoch, first, 1 + I);
        return run_batch<I + 1>(Fields(detail::call(st.f, std::move(b), g)), epoch, first, rows);
      }
    }
  }

  Source source_;
  pipeline<Stages...> p_;
  int threads_ = 2;
  PipelineRandom random_;
};

/// `source` run through `p`: `data::pipelined(data::CsvSource(path), map(f) | collate(stack()))`.
template <class Source, class... Stages>
Pipelined<Source, Stages...> pipelined(Source source, pipeline<Stages...> p, PipelineOptions options = {}) {
  return {std::move(source), std::move(p), options};
}

}  // namespace data

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/data/impl/pipeline.ipp>
#endif
