// SPDX-License-Identifier: Apache-2.0
#pragma once
// The Tuner's trial processes: each trial runs as this program started again with
// DTRAIN_TUNE_TRIAL naming its run directory, in a process group of its own (a terminal's Ctrl-C
// reaches the Tuner, which stops each trial once), sent SIGTERM by the kernel if the Tuner dies
// (each trial then stops its workers and records the stop, to resume on a re-run). A trial of a
// GPU Trainer gets GPUs of its own through CUDA_VISIBLE_DEVICES.

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <dtrain/error.hpp>
#include <dtrain/launch/environment.hpp>
#include <dtrain/launch/process.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace tune {

/// Sends this process's stdout and stderr (and so its workers') to the end of `log`.
void redirect_output(const std::filesystem::path& log);

/// The GPUs trial slot `slot` gets when each trial takes `per_trial`: its share of the GPUs this
/// process sees (`visible`, CUDA_VISIBLE_DEVICES's list, or "" for all `count` of them).
std::string slot_gpus(int slot, int per_trial, const std::string& visible, int count);

/// The trials running now, each in a slot (0 .. slots-1) that decides its GPUs.
class TrialProcesses {
 public:
  /// `gpus_per_trial` 0: CPU trials. `trial_variable`: the environment variable naming a trial.
  TrialProcesses(int slots, int gpus_per_trial, std::string trial_variable);

  int running() const { return group_.running_count(); }

  /// Starts this program again as the trial whose run directory is `dir`.
  void start(const std::filesystem::path& dir);

  /// The next trial that has ended, with how its process ended; does not block.
  std::optional<std::pair<std::filesystem::path, launch::ExitStatus>> poll();

  void signal_all(int sig) { group_.kill_all(sig); }
  /// How many GPUs the machine shows this process (for the slots' shares).
  void set_gpu_count(int n) { gpu_count_ = n; }

 private:
  launch::WorkerGroup group_{SIGTERM, /*own_process_group=*/true};
  std::vector<std::pair<std::filesystem::path, int>> trials_;  // by start order: directory, slot
  std::vector<bool> busy_;
  int gpus_ = 0, gpu_count_ = 0;
  std::string variable_;
};

}  // namespace tune

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/tune/impl/trial_process.ipp>
#endif
