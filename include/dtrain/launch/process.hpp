// SPDX-License-Identifier: Apache-2.0
#pragma once
// The driver's side of the process model: start worker copies of this executable, watch them, and
// make sure none outlives the driver.

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <dtrain/error.hpp>

extern char** environ;

DTRAIN_NAMESPACE_BEGIN

namespace launch {

/// This process's command line, as the kernel recorded it (so fit() needs no argc/argv).
std::vector<std::string> own_command_line();

/// The peak resident set of this process so far, in MiB (getrusage's ru_maxrss).
double peak_rss_mb();

/// When this process started, in seconds since the Unix epoch (10 ms resolution, from /proc).
///
/// /proc/self/stat gives the start in clock ticks since boot (CLOCK_BOOTTIME); it is placed on the
/// Unix clock by reading both clocks now. (/proc/stat's btime is whole seconds and would put the
/// start up to a second too early.)
double process_start_unix();

/// How a worker process ended.
struct ExitStatus {
  int rank = -1;
  int status = 0;  // as waitpid reports it
  bool ok() const { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }
  std::string describe() const;
};

/// Worker processes, one per rank, each killed with SIGKILL by the kernel if the driver dies
/// (PR_SET_PDEATHSIG), so none outlives it; the destructor kills and reaps any still running, so
/// none is left a zombie either.
class WorkerGroup {
 public:
  WorkerGroup() = default;
  /// Children that get `parent_death_signal` when this process dies (a Tuner's trials get
  /// SIGTERM: each stops its workers and records the stop), each in a process group of its own
  /// when `own_process_group` (a terminal's Ctrl-C then reaches this process only, which passes
  /// the stop on once).
  WorkerGroup(int parent_death_signal, bool own_process_group)
      : death_signal_(parent_death_signal), own_group_(own_process_group) {}

  /// Starts a worker that runs `argv` (this executable) with the environment `env` ("NAME=value").
  void start_exec(const std::vector<std::string>& argv, const std::vector<std::string>& env);

  /// Starts a worker that is a fork of this process running `body`, which must not return (it
  /// ends the process). The child starts with this process's memory: what was built before the
  /// fork, a dataset say, is shared copy-on-write instead of built again.
  template <class Body>
  void start_fork(Body&& body) {
    std::fflush(nullptr);  // or buffered output would be written twice
    start([&] {
      body();
      std::_Exit(1);
    });
  }

  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;
  ~WorkerGroup() {
    kill_all();
    reap_all();
  }

  int size() const { return static_cast<int>(pids_.size()); }
  bool running(int rank) const { return pids_[rank] > 0; }
  int running_count() const {
    int n = 0;
    for (pid_t p : pids_) n += p > 0;
    return n;
  }

  /// The next worker that has ended, if any has since the last call; does not block.
  std::optional<ExitStatus> poll();

  /// Sends `sig` to every worker still running.
  void kill_all(int sig = SIGKILL) {
    for (pid_t p : pids_)
      if (p > 0) ::kill(p, sig);
  }

  /// Waits for every worker to end (after kill_all, promptly).
  void reap_all();

 private:
  template <class Child>
  void start(Child&& child) {
    const pid_t parent = getpid();
    const pid_t pid = fork();
    if (pid < 0)
      throw Error(std::string("cannot start a worker process: fork failed: ") + std::strerror(errno));
    if (pid == 0) {
      if (own_group_) setpgid(0, 0);
      prctl(PR_SET_PDEATHSIG, death_signal_);
      if (getppid() != parent) _exit(127);  // the driver died before prctl took effect
      child();
      _exit(127);
    }
    pids_.push_back(pid);
  }

  std::vector<pid_t> pids_;
  int death_signal_ = SIGKILL;
  bool own_group_ = false;
};

/// The environment of this process as "NAME=value" strings, without the names in `drop`.
std::vector<std::string> current_environment(const std::vector<std::string>& drop);

}  // namespace launch

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/launch/impl/process.ipp>
#endif
