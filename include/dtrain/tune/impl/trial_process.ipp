// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of trial_process.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/tune/trial_process.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace tune {

DTRAIN_INLINE void redirect_output(const std::filesystem::path& log) {
  std::fflush(nullptr);
  const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(log.string() + ": cannot be opened for the trial's output (" + std::strerror(errno) + ")");
  ::dup2(fd, STDOUT_FILENO);
  ::dup2(fd, STDERR_FILENO);
  ::close(fd);
}

DTRAIN_INLINE std::string slot_gpus(int slot, int per_trial, const std::string& visible, int count) {
  std::vector<std::string> ids;
  if (visible.empty()) {
    for (int i = 0; i < count; ++i) ids.push_back(std::to_string(i));
  } else {
    std::stringstream s(visible);
    for (std::string id; std::getline(s, id, ',');) ids.push_back(id);
  }
  std::string out;
  for (int i = slot * per_trial; i < (slot + 1) * per_trial; ++i) {
    if (i >= static_cast<int>(ids.size()))
      throw ConfigError("tune: trial slot " + std::to_string(slot) + " needs GPUs " + std::to_string(slot * per_trial) +
                        ".." + std::to_string((slot + 1) * per_trial - 1) + " and " + std::to_string(ids.size()) +
                        " are visible; lower TuneConfig::max_concurrent_trials or ScalingConfig::num_workers");
    out += (out.empty() ? "" : ",") + ids[static_cast<std::size_t>(i)];
  }
  return out;
}

DTRAIN_INLINE TrialProcesses::TrialProcesses(int slots, int gpus_per_trial, std::string trial_variable)
    : busy_(static_cast<std::size_t>(slots), false), gpus_(gpus_per_trial), variable_(std::move(trial_variable)) {}

DTRAIN_INLINE void TrialProcesses::start(const std::filesystem::path& dir) {
  const auto free = std::find(busy_.begin(), busy_.end(), false);
  if (free == busy_.end()) throw Error("tune: no free trial slot (a bug: the Tuner starts a trial only when one is)");
  const int slot = static_cast<int>(free - busy_.begin());
  std::vector<std::string> drop = {variable_, launch::env_run_path, "MASTER_PORT"};
  if (gpus_ > 0) drop.push_back("CUDA_VISIBLE_DEVICES");
  auto env = launch::current_environment(drop);
  env.push_back(variable_ + "=" + dir.string());
  env.push_back(std::string(launch::env_run_path) + "=" + dir.string());
  if (gpus_ > 0) {
    const auto visible = launch::detail::env("CUDA_VISIBLE_DEVICES").value_or("");
    env.push_back("CUDA_VISIBLE_DEVICES=" + slot_gpus(slot, gpus_, visible, gpu_count_));
  }
  group_.start_exec(launch::own_command_line(), env);
  busy_[static_cast<std::size_t>(slot)] = true;
  trials_.push_back({dir, slot});
}

DTRAIN_INLINE std::optional<std::pair<std::filesystem::path, launch::ExitStatus>> TrialProcesses::poll() {
  auto ended = group_.poll();
  if (!ended) return std::nullopt;
  const auto& [dir, slot] = trials_[static_cast<std::size_t>(ended->rank)];
  busy_[static_cast<std::size_t>(slot)] = false;
  return std::pair{dir, *ended};
}
}  // namespace tune
DTRAIN_NAMESPACE_END
