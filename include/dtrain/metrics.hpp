// SPDX-License-Identifier: Apache-2.0
#pragma once
// Reported metrics: a name -> value map whose values are integers, reals or text.

#include <chrono>
#include <concepts>
#include <cstdio>
#include <cstdint>
#include <limits>
#include <map>
#include <ostream>
#include <string>
#include <string_view>
#include <variant>

#include <nlohmann/json.hpp>

#include <dtrain/error.hpp>

DTRAIN_NAMESPACE_BEGIN

/// One metric value. Built from any integer (kept exact as int64), any floating-point number
/// (double) or text, so `{{"epoch", epoch}, {"loss", loss.item<float>()}}` needs no casts.
class Metric {
 public:
  Metric() = default;
  template <std::integral T>
    requires(!std::same_as<T, bool>)
  Metric(T v) : value_(static_cast<std::int64_t>(v)) {}
  Metric(bool v) : value_(std::int64_t{v}) {}
  template <std::floating_point T>
  Metric(T v) : value_(static_cast<double>(v)) {}
  Metric(std::string v) : value_(std::move(v)) {}
  Metric(const char* v) : value_(std::string(v)) {}
  Metric(std::string_view v) : value_(std::string(v)) {}

  bool is_number() const { return !std::holds_alternative<std::string>(value_); }
  bool is_integer() const { return std::holds_alternative<std::int64_t>(value_); }

  /// The value as a real number; throws ConfigError for text.
  double number() const;
  /// The value as text, as it is written to CSV.
  std::string text() const;

  const std::variant<std::int64_t, double, std::string>& value() const { return value_; }
  friend bool operator==(const Metric&, const Metric&) = default;
  friend std::ostream& operator<<(std::ostream& os, const Metric& m) { return os << m.text(); }

  friend void to_json(nlohmann::json& j, const Metric& m) {
    std::visit([&](const auto& v) { j = v; }, m.value_);
  }
  friend void from_json(const nlohmann::json& j, Metric& m) {
    if (j.is_number_integer()) m.value_ = j.get<std::int64_t>();
    else if (j.is_number()) m.value_ = j.get<double>();
    else if (j.is_string()) m.value_ = j.get<std::string>();
    else if (j.is_null()) m.value_ = std::numeric_limits<double>::quiet_NaN();  // JSON has no NaN
    else throw ConfigError("metric value " + j.dump() + " is neither a number nor text");
  }

 private:
  std::variant<std::int64_t, double, std::string> value_{std::int64_t{0}};
};

/// What one call of report() records.
using Metrics = std::map<std::string, Metric, std::less<>>;

/// `metrics` as one line of text: "loss=0.41235, epoch=2" (reals to 5 significant digits).
std::string metrics_line(const Metrics& metrics);

/// Seconds since the Unix epoch, as the metrics rows' `timestamp` holds them.
double unix_now();

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/impl/metrics.ipp>
#endif
