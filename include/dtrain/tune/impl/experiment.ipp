// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of experiment.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/tune/experiment.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace tune {

DTRAIN_INLINE std::string ExperimentDirectory::trial_id(std::size_t index) {
  std::ostringstream s;
  s << "trial_" << std::setw(4) << std::setfill('0') << index;
  return s.str();
}

DTRAIN_INLINE FileLock::FileLock(const std::filesystem::path& path, bool wait) {
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0)
    throw Error(path.string() + ": cannot be opened as a lock file (" + std::strerror(errno) +
                "); check that the experiment directory is writable");
  int rc;
  while ((rc = ::flock(fd_, wait ? LOCK_EX : LOCK_EX | LOCK_NB)) < 0 && errno == EINTR) {}
  held_ = rc == 0;
}

DTRAIN_INLINE SchedulerLog SchedulerLog::read(const ExperimentDirectory& dir) {
  SchedulerLog log;
  const auto j = tracking::read_json(dir.scheduler_log(), nlohmann::json::object());
  try {
    // Named: a range-for over j.value(...).items() would outlive the temporary it iterates.
    const auto results = j.value("results", nlohmann::json::object()), stops = j.value("stops", nlohmann::json::object());
    for (const auto& [id, points] : results.items())
      for (const auto& p : points) log.results[id].push_back({p.at(0).get<double>(), p.at(1).get<double>()});
    for (const auto& [id, stop] : stops.items()) log.stops[id] = stop;
  } catch (const std::exception& e) {
    throw Error(dir.scheduler_log().string() + ": not a scheduler log (" + e.what() + ")");
  }
  return log;
}

DTRAIN_INLINE void SchedulerLog::write(const ExperimentDirectory& dir) const {
  nlohmann::json r = nlohmann::json::object(), s = nlohmann::json::object();
  for (const auto& [id, points] : results) {
    auto& list = r[id] = nlohmann::json::array();
    for (const auto& p : points) list.push_back({p.time, p.score});
  }
  for (const auto& [id, stop] : stops) s[id] = stop;
  tracking::write_json(dir.scheduler_log(), {{"format", 1}, {"results", r}, {"stops", s}});
}

DTRAIN_INLINE void SchedulerLog::record_stop(const ExperimentDirectory& dir, const std::string& trial, double time, const std::string& why) {
  FileLock lock(dir.scheduler_lock(), /*wait=*/true);
  auto log = read(dir);
  log.stops[trial] = {{"time", time}, {"why", why}};
  log.write(dir);
}
}  // namespace tune
DTRAIN_NAMESPACE_END
