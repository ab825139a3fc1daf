// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of metrics.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/metrics.hpp>

DTRAIN_NAMESPACE_BEGIN

DTRAIN_INLINE double Metric::number() const {
  if (auto* i = std::get_if<std::int64_t>(&value_)) return static_cast<double>(*i);
  if (auto* d = std::get_if<double>(&value_)) return *d;
  throw ConfigError("metric holds text \"" + std::get<std::string>(value_) + "\", not a number");
}

DTRAIN_INLINE std::string Metric::text() const {
  if (auto* s = std::get_if<std::string>(&value_)) return *s;
  return nlohmann::json(*this).dump();
}

DTRAIN_INLINE std::string metrics_line(const Metrics& metrics) {
  std::string line;
  for (const auto& [k, v] : metrics) {
    if (!line.empty()) line += ", ";
    line += k + "=";
    if (v.is_number() && !v.is_integer()) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.5g", v.number());
      line += buf;
    } else {
      line += v.text();
    }
  }
  return line;
}

DTRAIN_INLINE double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}
DTRAIN_NAMESPACE_END
