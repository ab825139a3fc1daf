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
  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
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
  Metric sample(Random& random) const {
    switch (kind) {
      case Kind::uniform: return low + random.unit() * (high - low);
      case Kind::loguniform: return std::exp(std::log(low) + random.unit() * (std::log(high) - std::log(low)));
      case Kind::randint:
        return static_cast<std::int64_t>(low) + static_cast<std::int64_t>(random.unit() * (high - low));
      case Kind::choice: return values[static_cast<std::size_t>(random.unit() * static_cast<double>(values.size()))];
      default: return values.front();
    }
  }

  /// The domain as tuner.json records it: {"loguniform": [1e-4, 0.1]}, {"grid": ["adam", "sgd"]}.
  nlohmann::json describe() const {
    static constexpr const char* names[] = {"constant", "uniform", "loguniform", "randint", "choice", "grid"};
    const auto name = names[static_cast<int>(kind)];
    if (kind == Kind::uniform || kind == Kind::loguniform) return {{name, {low, high}}};
    if (kind == Kind::randint) return {{name, {static_cast<std::int64_t>(low), static_cast<std::int64_t>(high)}}};
    if (kind == Kind::constant) return {{name, values.front()}};
    return {{name, values}};
  }
};

/// A real number uniform in [low, high).
inline Domain uniform(double low, double high) {
  if (!(low < high) || !std::isfinite(low) || !std::isfinite(high))
    throw ConfigError("tune::uniform(" + std::to_string(low) + ", " + std::to_string(high) +
                      "): the bounds must be finite with low < high");
  return {Domain::Kind::uniform, low, high, {}};
}
/// A positive real number whose logarithm is uniform in [log low, log high): learning rates.
inline Domain loguniform(double low, double high) {
  if (!(low > 0 && low < high) || !std::isfinite(high))
    throw ConfigError("tune::loguniform(" + std::to_string(low) + ", " + std::to_string(high) +
                      "): the bounds must be positive and finite with low < high");
  return {Domain::Kind::loguniform, low, high, {}};
}
/// An integer uniform in [low, high) (high excluded, as Ray's tune.randint).
inline Domain randint(std::int64_t low, std::int64_t high) {
  if (low >= high)
    throw ConfigError("tune::randint(" + std::to_string(low) + ", " + std::to_string(high) +
                      "): high is excluded, so it must be greater than low");
  return {Domain::Kind::randint, static_cast<double>(low), static_cast<double>(high), {}};
}
/// One of `values`, each as likely.
inline Domain choice(std::vector<Metric> values) {
  if (values.empty()) throw ConfigError("tune::choice({}): give at least one value");
  return {Domain::Kind::choice, 0, 0, std::move(values)};
}
/// Every one of `values`: each sample of the search runs once with each (Ray's tune.grid_search).
inline Domain grid(std::vector<Metric> values) {
  if (values.empty()) throw ConfigError("tune::grid({}): give at least one value");
  return {Domain::Kind::grid, 0, 0, std::move(values)};
}

class Space;

/// One entry of a Space: a name and a domain, a constant, or a nested Space.
struct Entry {
  Entry(std::string name, Domain domain) { add(std::move(name), std::move(domain)); }
  Entry(std::string name, Metric constant) { add(std::move(name), {Domain::Kind::constant, 0, 0, {std::move(constant)}}); }
  Entry(std::string name, const char* constant) : Entry(std::move(name), Metric(constant)) {}
  Entry(std::string name, const Space& nested);

  std::vector<std::pair<std::string, Domain>> flat;  // nested names joined by '.'

 private:
  void add(std::string name, Domain domain) {
    if (name.empty() || name.find('.') != std::string::npos)
      throw ConfigError("tune::Space: the parameter name \"" + name + "\" must be non-empty and without '.' "
                        "(nest a tune::Space for a struct member: {\"model\", tune::Space{{\"layers\", ...}}})");
    flat.emplace_back(std::move(name), std::move(domain));
  }
};

/// The parameters a Tuner searches, in the order given; nested spaces flattened to "a.b" names.
class Space {
 public:
  Space() = default;
  Space(std::initializer_list<Entry> entries) {
    for (const auto& e : entries)
      for (const auto& [name, domain] : e.flat) {
        for (const auto& [known, d] : params_)
          if (known == name) throw ConfigError("tune::Space: the parameter \"" + name + "\" is given twice");
        params_.emplace_back(name, domain);
      }
  }

  const std::vector<std::pair<std::string, Domain>>& parameters() const { return params_; }

  /// How many points the grid() parameters make together (1 when there are none).
  std::size_t grid_size() const {
    std::size_t n = 1;
    for (const auto& [name, d] : params_)
      if (d.kind == Domain::Kind::grid) n *= d.values.size();
    return n;
  }

  /// A config: grid point `grid_index` (the first grid parameter varies slowest), the sampled
  /// parameters drawn from `random` in the order of the space, the constants as they are.
  Metrics sample(std::size_t grid_index, Random& random) const {
    Metrics config;
    std::size_t stride = grid_size();
    for (const auto& [name, d] : params_) {
      if (d.kind == Domain::Kind::grid) {
        stride /= d.values.size();
        config[name] = d.values[(grid_index / stride) % d.values.size()];
      } else {
        config[name] = d.sample(random);
      }
    }
    return config;
  }

  /// The space as tuner.json records it: each name with its domain.
  nlohmann::json describe() const {
    nlohmann::json j = nlohmann::json::object();
    for (const auto& [name, d] : params_) j[name] = d.describe();
    return j;
  }

 private:
  std::vector<std::pair<std::string, Domain>> params_;
};

inline Entry::Entry(std::string name, const Space& nested) {
  if (name.empty() || name.find('.') != std::string::npos)
    throw ConfigError("tune::Space: the nested space's name \"" + name + "\" must be non-empty and without '.'");
  for (const auto& [inner, domain] : nested.parameters()) flat.emplace_back(name + "." + inner, domain);
}

/// A flat config ("model.layers": 2) as nested JSON ({"model": {"layers": 2}}).
inline nlohmann::json unflatten(const Metrics& flat) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [name, value] : flat) {
    nlohmann::json* at = &j;
    std::size_t from = 0;
    for (std::size_t dot; (dot = name.find('.', from)) != std::string::npos; from = dot + 1) {
      at = &(*at)[name.substr(from, dot - from)];
      if (!at->is_object() && !at->is_null())
        throw ConfigError("tune: the config has both \"" + name.substr(0, dot) + "\" and \"" + name + "\"");
    }
    (*at)[name.substr(from)] = value;
  }
  return j;
}

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
