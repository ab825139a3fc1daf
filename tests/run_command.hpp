// SPDX-License-Identifier: Apache-2.0
#pragma once
// Runs a shell command for a test: the scenarios program, Python's torch, a launcher.
#include <sys/wait.h>

#include <cstdio>
#include <string>

#include "dtrain_catch.hpp"

namespace dtrain_test {

struct CommandResult {
  int status = -1;  // the exit status; 128 + the signal when a signal ended it
  std::string output;  // stdout and stderr together
};

inline CommandResult run_command(const std::string& command) {
  CommandResult r;
  FILE* p = ::popen(("(" + command + ") 2>&1").c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[1 << 16];
  while (std::fgets(buf, sizeof buf, p)) r.output += buf;
  const int st = ::pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return r;
}

}  // namespace dtrain_test
