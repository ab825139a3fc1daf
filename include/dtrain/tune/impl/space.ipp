// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of space.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/tune/space.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace tune {

DTRAIN_INLINE std::uint64_t Random::next() {
  std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

DTRAIN_INLINE Metric Domain::sample(Random& random) const {
  switch (kind) {
    case Kind::uniform: return low + random.unit() * (high - low);
    case Kind::loguniform: return std::exp(std::log(low) + random.unit() * (std::log(high) - std::log(low)));
    case Kind::randint:
      return static_cast<std::int64_t>(low) + static_cast<std::int64_t>(random.unit() * (high - low));
    case Kind::choice: return values[static_cast<std::size_t>(random.unit() * static_cast<double>(values.size()))];
    default: return values.front();
  }
}

DTRAIN_INLINE nlohmann::json Domain::describe() const {
  static constexpr const char* names[] = {"constant", "uniform", "loguniform", "randint", "choice", "grid"};
  const auto name = names[static_cast<int>(kind)];
  if (kind == Kind::uniform || kind == Kind::loguniform) return {{name, {low, high}}};
  if (kind == Kind::randint) return {{name, {static_cast<std::int64_t>(low), static_cast<std::int64_t>(high)}}};
  if (kind == Kind::constant) return {{name, values.front()}};
  return {{name, values}};
}

DTRAIN_INLINE Domain uniform(double low, double high) {
  if (!(low < high) || !std::isfinite(low) || !std::isfinite(high))
    throw ConfigError("tune::uniform(" + std::to_string(low) + ", " + std::to_string(high) +
                      "): the bounds must be finite with low < high");
  return {Domain::Kind::uniform, low, high, {}};
}

DTRAIN_INLINE Domain loguniform(double low, double high) {
  if (!(low > 0 && low < high) || !std::isfinite(high))
    throw ConfigError("tune::loguniform(" + std::to_string(low) + ", " + std::to_string(high) +
                      "): the bounds must be positive and finite with low < high");
  return {Domain::Kind::loguniform, low, high, {}};
}

DTRAIN_INLINE Domain randint(std::int64_t low, std::int64_t high) {
  if (low >= high)
    throw ConfigError("tune::randint(" + std::to_string(low) + ", " + std::to_string(high) +
                      "): high is excluded, so it must be greater than low");
  return {Domain::Kind::randint, static_cast<double>(low), static_cast<double>(high), {}};
}

DTRAIN_INLINE Domain choice(std::vector<Metric> values) {
  if (values.empty()) throw ConfigError("tune::choice({}): give at least one value");
  return {Domain::Kind::choice, 0, 0, std::move(values)};
}

DTRAIN_INLINE Domain grid(std::vector<Metric> values) {
  if (values.empty()) throw ConfigError("tune::grid({}): give at least one value");
  return {Domain::Kind::grid, 0, 0, std::move(values)};
}

DTRAIN_INLINE Entry::Entry(std::string name, Metric constant) { add(std::move(name), {Domain::Kind::constant, 0, 0, {std::move(constant)}}); }

DTRAIN_INLINE void Entry::add(std::string name, Domain domain) {
  if (name.empty() || name.find('.') != std::string::npos)
    throw ConfigError("tune::Space: the parameter name \"" + name + "\" must be non-empty and without '.' "
                      "(nest a tune::Space for a struct member: {\"model\", tune::Space{{\"layers\", ...}}})");
  flat.emplace_back(std::move(name), std::move(domain));
}

DTRAIN_INLINE Space::Space(std::initializer_list<Entry> entries) {
  for (const auto& e : entries)
    for (const auto& [name, domain] : e.flat) {
      for (const auto& [known, d] : params_)
        if (known == name) throw ConfigError("tune::Space: the parameter \"" + name + "\" is given twice");
      params_.emplace_back(name, domain);
    }
}

DTRAIN_INLINE std::size_t Space::grid_size() const {
  std::size_t n = 1;
  for (const auto& [name, d] : params_)
    if (d.kind == Domain::Kind::grid) n *= d.values.size();
  return n;
}

DTRAIN_INLINE Metrics Space::sample(std::size_t grid_index, Random& random) const {
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

DTRAIN_INLINE nlohmann::json Space::describe() const {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [name, d] : params_) j[name] = d.describe();
  return j;
}

DTRAIN_INLINE Entry::Entry(std::string name, const Space& nested) {
  if (name.empty() || name.find('.') != std::string::npos)
    throw ConfigError("tune::Space: the nested space's name \"" + name + "\" must be non-empty and without '.'");
  for (const auto& [inner, domain] : nested.parameters()) flat.emplace_back(name + "." + inner, domain);
}

DTRAIN_INLINE nlohmann::json unflatten(const Metrics& flat) {
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
}  // namespace tune
DTRAIN_NAMESPACE_END
