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
inline std::vector<std::string> own_command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::vector<std::string> args;
  std::string arg;
  while (std::getline(in, arg, '\0')) args.push_back(arg);
  if (args.empty()) throw Error("cannot read /proc/self/cmdline to start workers (is /proc mounted?)");
  return args;
}

/// The peak resident set of this process so far, in MiB (getrusage's ru_maxrss).
inline double peak_rss_mb() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;  // Linux reports KiB
}

/// When this process started, in seconds since the Unix epoch (10 ms resolution, from /proc).
///
/// /proc/self/stat gives the start in clock ticks since boot (CLOCK_BOOTTIME); it is placed on the
/// Unix clock by reading both clocks now. (/proc/stat's btime is whole seconds and would put the
/// start up to a second too early.)
inline double process_start_unix() {
  std::ifstream stat("/proc/self/stat");
  std::string line;
  std::getline(stat, line);
  // Field 22 (starttime) counts from after the ")" closing field 2.
  std::istringstream fields(line.substr(line.rfind(')') + 2));
  std::string f;
  for (int i = 3; i < 22 && fields >> f; ++i) {}
  unsigned long long ticks = 0;
  fields >> ticks;
  timespec boot{}, real{};
  ::clock_gettime(CLOCK_BOOTTIME, &boot);
  ::clock_gettime(CLOCK_REALTIME, &real);
  const double since_boot = static_cast<double>(ticks) / static_cast<double>(sysconf(_SC_CLK_TCK));
  const double age = static_cast<double>(boot.tv_sec) + 1e-9 * static_cast<double>(boot.tv_nsec) - since_boot;
  return static_cast<double>(real.tv_sec) + 1e-9 * static_cast<double>(real.tv_nsec) - age;
}

/// How a worker process ended.
struct ExitStatus {
  int rank = -1;
  int status = 0;  // as waitpid reports it
  bool ok() const { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }
  std::string describe() const {
    if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
    if (WIFSIGNALED(status)) {
      const int sig = WTERMSIG(status);
      return std::string("was killed by signal ") + std::to_string(sig) + " (" + strsignal(sig) + ")";
    }
    return "ended in an unknown way (wait status " + std::to_string(status) + ")";
  }
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
  void start_exec(const std::vector<std::string>& argv, const std::vector<std::string>& env) {
    char exe[4096];
    const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) throw Error("cannot resolve /proc/self/exe to start a worker");
    exe[n] = '\0';
    std::vector<char*> args, envp;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
    args.push_back(nullptr);
    envp.push_back(nullptr);
    start([&] {
      // Only async-signal-safe calls from here to exec.
      syscall(SYS_close_range, 3u, ~0u, 0u);  // the driver's sockets (the store) stay with it
      execve(exe, args.data(), envp.data());
      _exit(127);
    });
  }

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
  std::optional<ExitStatus> poll() {
    for (int r = 0; r < size(); ++r) {
      if (pids_[r] <= 0) continue;
      int status = 0;
      const pid_t got = waitpid(pids_[r], &status, WNOHANG);
      if (got == pids_[r]) {
        pids_[r] = 0;
        return ExitStatus{r, status};
      }
    }
    return std::nullopt;
  }

  /// Sends `sig` to every worker still running.
  void kill_all(int sig = SIGKILL) {
    for (pid_t p : pids_)
      if (p > 0) ::kill(p, sig);
  }

  /// Waits for every worker to end (after kill_all, promptly).
  void reap_all() {
    for (pid_t& p : pids_) {
      if (p <= 0) continue;
      int status = 0;
      while (waitpid(p, &status, 0) < 0 && errno == EINTR) {}
      p = 0;
    }
  }

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
inline std::vector<std::string> current_environment(const std::vector<std::string>& drop) {
  std::vector<std::string> out;
  for (char** e = environ; *e; ++e) {
    const std::string entry = *e;
    const std::string name = entry.substr(0, entry.find('='));
    bool keep = true;
    for (const auto& d : drop) keep = keep && name != d;
    if (keep) out.push_back(entry);
  }
  return out;
}

}  // namespace launch

DTRAIN_NAMESPACE_END
