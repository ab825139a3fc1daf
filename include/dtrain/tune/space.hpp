// SPDX-License-Identifier: Apache-2.0
#pragma once
// tune::Space: the parameters a Tuner searches, after Ray Tune's search space.
//
//   dtrain::tune::Space space{
//       {"lr", dtrain::tune::loguniform(1e-4, 1e-1)},      // sampled: uniform, loguniform, randint, choice
//       {"optimizer", dtrain::tune::grid({"adam", "sgd"})}, // enumerated: every value, in every sample
//       {"epochs", 10},                                     // a constant
//       {"model", dtrain::tune::Space{{"layers", dtrain::tune::randint(1, 4)}}},  // nested: "model.layers"
//   };
//
// A trial's config is flat (Metrics, the trial's RunConfig::train_loop_config), nested names joined
// by '.'; tune::config<T>(ctx) reads it back into the loop's own struct. Sampling uses its own
// generator (SplitMix64) and arithmetic, so a seed gives the same trials with any standard library.

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <dtrain/error.hpp>
#include <dtrain/metrics.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace tune {

/// A seeded stream of uniform numbers: SplitMix64, the same everywhere.
class Random {
 public:
  explicit Random(std::uint64_t seed) : state_(seed) {}
  /// The generator of trial `index` of a search seeded with `seed`.
  static Random of_trial(std::uint64_t seed, std::uint64_t index) {
    Random r(seed ^ 0x6a09e667f3bcc909ull);
    r.state_ ^= r.next() + index * 0x9e3779b97f4a7c15ull;
    return r;
  }
  std::uint64_t next();
  /// Uniform in [0, 1), 53 bits.
  double unit() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

 private:
  std::uint64_t state_;
};

/// One parameter's values: sampled (uniform, loguniform, randint, choice), enumerated (grid) or
/// fixed (constant). Made by the functions below, which check their arguments.
struct Domain {
  enum class Kind { constant, uniform, loguniform, randint, choice, grid };
  Kind kind = Kind::constant;
  double low = 0, high = 0;
  std::vector<Metric> values;  // constant (one), choice and grid

  /// A value for a trial (grid: the caller picks; see Space::sample).
  Metric sample(Random& random) const;

  /// The domain as tuner.json records it: {"loguniform": [1e-4, 0.1]}, {"grid": ["adam", "sgd"]}.
  nlohmann::json describe() const;
};

/// A real number uniform in [low, high).
Domain uniform(double low, double high);
/// A positive real number whose logarithm is uniform in [log low, log high): learning rates.
Domain loguniform(double low, double high);
/// An integer uniform in [low, high) (high excluded, as Ray's tune.randint).
Domain randint(std::int64_t low, std::int64_t high);
/// One of `values`, each as likely.
Domain choice(std::vector<Metric> values);
/// Every one of `values`: each sample of the search runs once with each (Ray's tune.grid_search).
Domain grid(std::vector<Metric> values);

class Space;

/// One entry of a Space: a name and a domain, a constant, or a nested Space.
struct Entry {
  Entry(std::string name, Domain domain) { add(std::move(name), std::move(domain)); }
  Entry(std::string name, Metric constant);
  Entry(std::string name, const char* constant) : Entry(std::move(name), Metric(constant)) {}
  Entry(std::string name, const Space& nested);

  std::vector<std::pair<std::string, Domain>> flat;  // nested names joined by '.'

 private:
  void add(std::string name, Domain domain);
};

/// The parameters a Tuner searches, in the order given; nested spaces flattened to "a.b" names.
class Space {
 public:
  Space() = default;
  Space(std::initializer_list<Entry> entries);

  const std::vector<std::pair<std::string, Domain>>& parameters() const { return params_; }

  /// How many points the grid() parameters make together (1 when there are none).
  std::size_t grid_size() const;

  /// A config: grid point `grid_index` (the first grid parameter varies slowest), the sampled
  /// parameters drawn from `random` in the order of the space, the constants as they are.
  Metrics sample(std::size_t grid_index, Random& random) const;

  /// The space as tuner.json records it: each name with its domain.
  nlohmann::json describe() const;

 private:
  std::vector<std::pair<std::string, Domain>> params_;
};

/// A flat config ("model.layers": 2) as nested JSON ({"model": {"layers": 2}}).
nlohmann::json unflatten(const Metrics& flat);

/// The trial's config read into `T` (any type nlohmann::json converts, default-constructible): the
/// defaults of T{}, overridden by every value of `flat` whose (nested) name T has.
template <class T>
T config(const Metrics& flat) {
  nlohmann::json j = T{};
  j.merge_patch(unflatten(flat));
  try {
    return j.get<T>();
  } catch (const std::exception& e) {
    throw ConfigError("tune::config: the trial's config " + nlohmann::json(flat).dump() +
                      " does not convert to the loop's config type (" + e.what() +
                      "); make the space's names and value types those of its JSON conversion");
  }
}
/// config<T> of the trial a worker runs: `auto c = tune::config<TaggerConfig>(ctx);`
template <class T, class Context>
  requires requires(const Context& c) { c.run_config().train_loop_config; }
T config(const Context& ctx) {
  return config<T>(ctx.run_config().train_loop_config);
}

}  // namespace tune

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/tune/impl/space.ipp>
#endif
