// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of mlflow.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/tracker/mlflow.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace tracker {
namespace mlflow_detail {

DTRAIN_INLINE std::string quoted(const std::string& s) {  // a YAML single-quoted scalar
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("''") : std::string(1, c);
  return q + "'";
}

DTRAIN_INLINE std::string key(const std::string& name) {
  std::string k;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                    c == '-' || c == '.' || c == ' ' || c == '/';
    k += ok ? c : '_';
  }
  while (!k.empty() && k.front() == '/') k.erase(k.begin());
  for (auto at = k.find(".."); at != std::string::npos; at = k.find("..")) k.replace(at, 2, "__");
  return k.empty() ? "_" : k;
}

DTRAIN_INLINE std::string run_id(const fs::path& run_dir, std::int64_t start_ms) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : fs::absolute(run_dir).lexically_normal().string()) h = (h ^ c) * 1099511628211ull;
  char buf[40];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(h),
                static_cast<unsigned long long>(start_ms));
  return buf;
}

DTRAIN_INLINE std::string value_text(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  std::string s = buf;
  if (s.find_first_of(".e") == std::string::npos) s += ".0";  // as Python prints a float
  return s;
}

DTRAIN_INLINE void write_once(const fs::path& p, const std::string& text) {
  if (fs::exists(p)) return;
  fs::create_directories(p.parent_path());
  const auto own = fs::path(p.string() + ".tmp" + std::to_string(::getpid()));
  tracking::write_atomically(own, text);
  std::error_code ec;
  fs::create_hard_link(own, p, ec);  // fails when another run's is there: it stays
  fs::remove(own, ec);
}

DTRAIN_INLINE std::string user() {
  if (const char* u = std::getenv("USER"); u && *u) return u;
  if (const char* u = std::getenv("LOGNAME"); u && *u) return u;
  if (const passwd* pw = ::getpwuid(::getuid()); pw && pw->pw_name && *pw->pw_name) return pw->pw_name;
  return "unknown";
}

DTRAIN_INLINE std::string program() {
  std::error_code ec;
  const auto exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : exe.string();
}

DTRAIN_INLINE std::string experiment_id(const std::string& name) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  return std::to_string((h >> 1) | (1ull << 40));  // positive, never "0" (MLflow's Default)
}

DTRAIN_INLINE void add_row(std::map<std::string, std::string>& lines, const Metrics& row) {
  const auto ts = row.count("timestamp") ? ms(row.at("timestamp").number()) : std::int64_t{0};
  const auto step = row.count("step") ? static_cast<std::int64_t>(row.at("step").number()) : std::int64_t{0};
  for (const auto& [k, v] : row) {
    if (!v.is_number() || k == "timestamp" || k == "step" || k == "iteration" ||
        (k.size() > 5 && k.compare(k.size() - 5, 5, "_unix") == 0))
      continue;
    lines[key(k)] += std::to_string(ts) + " " + value_text(v.number()) + " " + std::to_string(step) + "\n";
  }
}
}  // namespace mlflow_detail
}  // namespace tracker
DTRAIN_NAMESPACE_END
