// SPDX-License-Identifier: Apache-2.0
#pragma once
// What the ViT and CLIP tests share: a temporary directory, the message of an exception, the largest
// difference of two tensors, and a reference script (tests/unit/vit_reference.py, clip_reference.py)
// run with the Python of scripts/python-env.

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

#include <torch/types.h>

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

/// The largest absolute difference of two tensors, in double.
inline double max_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>();
}

inline std::vector<std::string> sorted(std::vector<std::string> v) {
  std::sort(v.begin(), v.end());
  return v;
}

/// Runs a reference script (tests/unit/vit_reference.py unless named) with `args`.
inline dtrain_test::CommandResult reference(const std::string& args, const char* script = DTRAIN_VIT_REFERENCE) {
  return dtrain_test::run_command(std::string(DTRAIN_VENV_PYTHON) + " " + script + " " + args);
}

/// The script's `make DIR`: the model directories, reference.safetensors and images.
inline void make_reference(const std::filesystem::path& dir, const char* script = DTRAIN_VIT_REFERENCE) {
  const auto r = reference("make " + dir.string(), script);
  INFO(r.output);
  REQUIRE(r.status == 0);
}

/// A check of the script (check, process, compare): "N checks, 0 failed" with N > 0, printed in the
/// log. Returns the script's output.
inline std::string check_in_python(const std::string& args, const char* script = DTRAIN_VIT_REFERENCE) {
  const auto r = reference(args, script);
  INFO(r.output);
  std::cout << r.output;  // the largest differences, in the test's log
  CHECK(r.status == 0);
  CHECK_THAT(r.output, Catch::Contains(" checks, 0 failed"));
  CHECK_THAT(r.output, !Catch::StartsWith("0 checks") && !Catch::Contains("\n0 checks"));
  return r.output;
}

}  // namespace vit_test
