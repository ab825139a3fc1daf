// SPDX-License-Identifier: Apache-2.0
#pragma once
// Whether the process that records a run still runs. outcome.json says "running" from the start
// until the driver records the end; a driver killed by SIGKILL (or lost with its machine) never
// does. So outcome.json also names the driver (ProcessIdentity: pid, start time, host, boot id,
// pid namespace) and carries a heartbeat time the driver rewrites every
// driver_heartbeat_interval, and a reader (Result::from_path) tells the two apart:
//
// - on the driver's own machine, boot and pid namespace, exactly: is that pid alive, not a zombie,
//   and the same process (its start time), not a later one that reuses the pid;
// - on the same host name with another boot id: the machine restarted since, so it is gone;
// - elsewhere, by the heartbeat: none for driver_heartbeat_misses intervals means gone (clocks of
//   two machines may differ by a little; a minute is far beyond that).
//
// Under torchrun, Slurm or Open MPI rank 0 records the run and does not beat (its training thread
// is the user's): only the first rule applies there.

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <system_error>
#include <filesystem>
#include <vector>

#include <nlohmann/json.hpp>

#include <dtrain/error.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace launch {

/// How often the driver rewrites outcome.json's heartbeat_time while the run goes on.
inline constexpr std::chrono::seconds driver_heartbeat_interval{10};
/// How many heartbeat intervals without one make a reader on another machine call the run gone.
inline constexpr int driver_heartbeat_misses = 6;

namespace detail {
inline std::string first_line(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::string line;
  std::getline(in, line);
  return line;
}

// /proc/PID/stat's fields after the command name: [0] the state (field 3), [19] the start time in
// clock ticks since boot (field 22). Empty when there is no such process.
inline std::vector<std::string> stat_fields(int pid) {
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

/// A process, named so that a reader can tell whether it still runs.
struct ProcessIdentity {
  int pid = 0;
  /// /proc/PID/stat's start time (clock ticks since boot): tells the process from a later one
  /// that reuses its pid. -1 when unknown.
  std::int64_t start_ticks = -1;
  std::string host, boot_id, pid_namespace;

  /// This process.
  static ProcessIdentity self() {
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

  nlohmann::json to_json() const {
    return {{"pid", pid}, {"start_ticks", start_ticks}, {"host", host}, {"boot_id", boot_id},
            {"pid_namespace", pid_namespace}};
  }

  /// The identity outcome.json's "driver" holds, or nothing when it holds none (a file written
  /// before it existed) or not this shape.
  static std::optional<ProcessIdentity> from_json(const nlohmann::json& j) {
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

  /// Whether its pid means the same process here: this host, this boot, this pid namespace.
  bool checkable_here(const ProcessIdentity& here) const {
    return pid > 0 && !boot_id.empty() && boot_id == here.boot_id && host == here.host &&
           pid_namespace == here.pid_namespace;
  }

  /// On its own machine (checkable_here): whether it still runs, neither ended nor a zombie, and
  /// is not a later process with its pid.
  bool alive() const {
    const auto fields = detail::stat_fields(pid);
    if (fields.size() <= 19) return false;
    if (fields[0] == "Z" || fields[0] == "X" || fields[0] == "x") return false;
    return start_ticks < 0 || fields[19] == std::to_string(start_ticks);
  }

  std::string describe() const {
    return "pid " + std::to_string(pid) + (host.empty() ? std::string() : " on " + host);
  }
};

/// Why the run that `outcome` (outcome.json) says is "running" no longer runs, or nothing when it
/// may still (or outcome.json cannot tell: written before it named its driver). `now` is Unix time.
inline std::optional<std::string> driver_gone(const nlohmann::json& outcome, double now) {
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
