// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of liveness.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/launch/liveness.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace launch {
namespace detail {

DTRAIN_INLINE std::vector<std::string> stat_fields(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  const std::string stat{std::istreambuf_iterator<char>(in), {}};
  const auto close = stat.rfind(')');  // the command name may hold spaces and parentheses
  std::vector<std::string> out;
  if (close == std::string::npos) return out;
  std::istringstream fields(stat.substr(close + 1));
  for (std::string f; fields >> f;) out.push_back(f);
  return out;
}
}  // namespace detail

DTRAIN_INLINE ProcessIdentity ProcessIdentity::self() {
  ProcessIdentity p;
  p.pid = static_cast<int>(::getpid());
  const auto fields = detail::stat_fields(p.pid);
  if (fields.size() > 19) p.start_ticks = std::strtoll(fields[19].c_str(), nullptr, 10);
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) == 0) p.host = name;
  p.boot_id = detail::first_line("/proc/sys/kernel/random/boot_id");
  std::error_code ec;
  p.pid_namespace = std::filesystem::read_symlink("/proc/self/ns/pid", ec).string();
  return p;
}

DTRAIN_INLINE nlohmann::json ProcessIdentity::to_json() const {
  return {{"pid", pid}, {"start_ticks", start_ticks}, {"host", host}, {"boot_id", boot_id},
          {"pid_namespace", pid_namespace}};
}

DTRAIN_INLINE std::optional<ProcessIdentity> ProcessIdentity::from_json(const nlohmann::json& j) {
  if (!j.is_object() || !j.contains("pid") || !j["pid"].is_number_integer()) return std::nullopt;
  ProcessIdentity p;
  p.pid = j["pid"].get<int>();
  auto text = [&](const char* key) { return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : ""; };
  p.host = text("host");
  p.boot_id = text("boot_id");
  p.pid_namespace = text("pid_namespace");
  if (j.contains("start_ticks") && j["start_ticks"].is_number_integer()) p.start_ticks = j["start_ticks"].get<std::int64_t>();
  return p;
}

DTRAIN_INLINE bool ProcessIdentity::checkable_here(const ProcessIdentity& here) const {
  return pid > 0 && !boot_id.empty() && boot_id == here.boot_id && host == here.host &&
         pid_namespace == here.pid_namespace;
}

DTRAIN_INLINE bool ProcessIdentity::alive() const {
  const auto fields = detail::stat_fields(pid);
  if (fields.size() <= 19) return false;
  if (fields[0] == "Z" || fields[0] == "X" || fields[0] == "x") return false;
  return start_ticks < 0 || fields[19] == std::to_string(start_ticks);
}

DTRAIN_INLINE std::string ProcessIdentity::describe() const {
  return "pid " + std::to_string(pid) + (host.empty() ? std::string() : " on " + host);
}

DTRAIN_INLINE std::optional<std::string> driver_gone(const nlohmann::json& outcome, double now) {
  if (!outcome.is_object() || outcome.value("status", nlohmann::json()) != "running") return std::nullopt;
  const auto driver = ProcessIdentity::from_json(outcome.value("driver", nlohmann::json()));
  if (!driver) return std::nullopt;
  const auto here = ProcessIdentity::self();
  if (driver->checkable_here(here)) {
    if (driver->alive()) return std::nullopt;
    return "the process that recorded it (" + driver->describe() +
           ") has ended without recording how the run ended: it was killed (SIGKILL?) or crashed";
  }
  if (!driver->host.empty() && driver->host == here.host && !driver->boot_id.empty() && !here.boot_id.empty() &&
      driver->boot_id != here.boot_id && driver->pid_namespace == here.pid_namespace)
    return "the machine of the process that recorded it (" + driver->describe() + ") has restarted since";
  const auto beat = outcome.value("heartbeat_time", nlohmann::json());
  const auto interval = outcome.value("heartbeat_interval_s", nlohmann::json());
  if (!beat.is_number() || !interval.is_number() || interval.get<double>() <= 0) return std::nullopt;
  const double silent = now - beat.get<double>();
  if (silent <= driver_heartbeat_misses * interval.get<double>()) return std::nullopt;
  return "the process that recorded it (" + driver->describe() + ") has not written a heartbeat for " +
         std::to_string(static_cast<long long>(silent)) + " s (it writes one every " +
         std::to_string(static_cast<long long>(interval.get<double>())) + " s): it was killed or lost with its machine";
}
}  // namespace launch
DTRAIN_NAMESPACE_END
