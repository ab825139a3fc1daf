// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of process.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/launch/process.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace launch {

DTRAIN_INLINE std::vector<std::string> own_command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::vector<std::string> args;
  std::string arg;
  while (std::getline(in, arg, '\0')) args.push_back(arg);
  if (args.empty()) throw Error("cannot read /proc/self/cmdline to start workers (is /proc mounted?)");
  return args;
}

DTRAIN_INLINE double peak_rss_mb() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;  // Linux reports KiB
}

DTRAIN_INLINE double process_start_unix() {
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

DTRAIN_INLINE std::string ExitStatus::describe() const {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    return std::string("was killed by signal ") + std::to_string(sig) + " (" + strsignal(sig) + ")";
  }
  return "ended in an unknown way (wait status " + std::to_string(status) + ")";
}

DTRAIN_INLINE void WorkerGroup::start_exec(const std::vector<std::string>& argv, const std::vector<std::string>& env) {
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

DTRAIN_INLINE std::optional<ExitStatus> WorkerGroup::poll() {
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

DTRAIN_INLINE void WorkerGroup::reap_all() {
  for (pid_t& p : pids_) {
    if (p <= 0) continue;
    int status = 0;
    while (waitpid(p, &status, 0) < 0 && errno == EINTR) {}
    p = 0;
  }
}

DTRAIN_INLINE std::vector<std::string> current_environment(const std::vector<std::string>& drop) {
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
