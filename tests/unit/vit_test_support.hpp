// SPDX-License-Identifier: Apache-2.0
#pragma once
// What vit_test.cpp and vit_processor_test.cpp share: a temporary directory, the message of an
// exception, and tests/unit/vit_reference.py run with the Python of scripts/python-env.

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "../dtrain_catch.hpp"
#include "../run_command.hpp"

namespace vit_test {

struct Dir {
  std::filesystem::path path;
  explicit Dir(const std::string& name) {
    std::random_device rd;
    path = std::filesystem::temp_directory_path() / ("dtrain_" + name + "_" + std::to_string(rd()) + std::to_string(getpid()));
    std::filesystem::create_directories(path);
  }
  ~Dir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::filesystem::path operator/(const std::string& n) const { return path / n; }
};

inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

inline std::vector<std::string> sorted(std::vector<std::string> v) {
  std::sort(v.begin(), v.end());
  return v;
}

/// Runs tests/unit/vit_reference.py with `args`.
inline dtrain_test::CommandResult reference(const std::string& args) {
  return dtrain_test::run_command(std::string(DTRAIN_VENV_PYTHON) + " " + DTRAIN_VIT_REFERENCE + " " + args);
}

/// vit_reference.py make DIR: the model directories, reference.safetensors and images.
inline void make_reference(const std::filesystem::path& dir) {
  const auto r = reference("make " + dir.string());
  INFO(r.output);
  REQUIRE(r.status == 0);
}

/// A check of vit_reference.py (check, process): "N checks, 0 failed" with N > 0, printed in the log.
inline void check_in_python(const std::string& args) {
  const auto r = reference(args);
  INFO(r.output);
  std::cout << r.output;  // the largest differences, in the test's log
  CHECK(r.status == 0);
  CHECK_THAT(r.output, Catch::Contains(" checks, 0 failed"));
  CHECK_THAT(r.output, !Catch::StartsWith("0 checks") && !Catch::Contains("\n0 checks"));
}

}  // namespace vit_test
