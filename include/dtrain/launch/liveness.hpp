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
std::vector<std::string> stat_fields(int pid);
}  // namespace detail

/// A process, named so that a reader can tell whether it still runs.
struct ProcessIdentity {
  int pid = 0;
  /// /proc/PID/stat's start time (clock ticks since boot): tells the process from a later one
  /// that reuses its pid. -1 when unknown.
  std::int64_t start_ticks = -1;
  std::string host, boot_id, pid_namespace;

  /// This process.
  static ProcessIdentity self();

  nlohmann::json to_json() const;

  /// The identity outcome.json's "driver" holds, or nothing when it holds none (a file written
  /// before it existed) or not this shape.
  static std::optional<ProcessIdentity> from_json(const nlohmann::json& j);

  /// Whether its pid means the same process here: this host, this boot, this pid namespace.
  bool checkable_here(const ProcessIdentity& here) const;

  /// On its own machine (checkable_here): whether it still runs, neither ended nor a zombie, and
  /// is not a later process with its pid.
  bool alive() const;

  std::string describe() const;
};

/// Why the run that `outcome` (outcome.json) says is "running" no longer runs, or nothing when it
/// may still (or outcome.json cannot tell: written before it named its driver). `now` is Unix time.
std::optional<std::string> driver_gone(const nlohmann::json& outcome, double now);

}  // namespace launch

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/launch/impl/liveness.ipp>
#endif
