// SPDX-License-Identifier: Apache-2.0
#pragma once
// Directories where a test runs its scenario programs, under the system's temporary directory. The
// test program (tests/catch_main.cpp) removes every one it made when it ends with all its tests
// passed, and keeps them, named on stderr, when one failed: what the programs wrote there is what a
// failure is read from. (Before, each suite run left about 130 of them behind.)
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

namespace dtrain_test {

inline std::vector<std::filesystem::path>& scratch_directories() {
  static std::vector<std::filesystem::path> made;
  return made;
}

/// <temporary directory>/<name>, made if it is not there; the same path for the same name.
inline std::filesystem::path scratch_directory(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / name;
  std::filesystem::create_directories(dir);
  auto& made = scratch_directories();
  if (std::find(made.begin(), made.end(), dir) == made.end()) made.push_back(dir);
  return dir;
}

/// At the test program's end: removes the scratch directories if every test passed.
inline void finish_scratch_directories(bool passed) {
  for (const auto& dir : scratch_directories()) {
    std::error_code ignored;
    if (passed)
      std::filesystem::remove_all(dir, ignored);
    else if (std::filesystem::exists(dir, ignored))
      std::fprintf(stderr, "kept for inspection: %s\n", dir.c_str());
  }
}

}  // namespace dtrain_test
