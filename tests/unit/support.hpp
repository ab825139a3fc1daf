// SPDX-License-Identifier: Apache-2.0
#pragma once
// Helpers shared by the unit tests: the largest difference of two tensors, a file's bytes, a scratch directory that cleans up after itself, and a matcher
// for "the exception's message names all of these".

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <random>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include <torch/types.h>

#include "../dtrain_catch.hpp"

namespace dtrain_test {

/// The largest absolute difference of two tensors of one shape, in double; where `mask` ([batch,
/// positions], nonzero: counted) is given, only over those positions of [batch, positions, width]
/// tensors. 0 when nothing is compared.
inline double max_diff(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& mask = {}) {
  REQUIRE(a.sizes() == b.sizes());
  auto gap = (a.to(torch::kDouble) - b.to(torch::kDouble)).abs();
  if (mask.defined()) gap = gap.masked_select(mask.to(torch::kBool).unsqueeze(-1).expand_as(gap));
  return gap.numel() ? gap.max().item<double>() : 0.0;
}

/// A file's bytes; "" when it cannot be read.
inline std::string slurp(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

/// A fresh directory under the system's temporary directory, removed with everything in it when the
/// object goes away. The name holds the process id, a counter and a random number, so parallel
/// ctest runs and repeated sections never share one.
class TempDir {
 public:
  TempDir() {
    static std::atomic<unsigned> counter{0};
    std::random_device random;
    const auto base = std::filesystem::temp_directory_path();
    for (;;) {
      path_ = base / ("dtrain-unit-" + std::to_string(::getpid()) + "-" + std::to_string(counter++) +
                      "-" + std::to_string(random()));
      if (std::filesystem::create_directory(path_)) return;  // false: the name was taken; retry
    }
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

/// Matches an exception whose what() contains every one of the given strings. Catch prints the
/// message of a failing exception itself, so a failure shows both what was wanted and what came.
class MessageContains : public Catch::MatcherBase<std::exception> {
 public:
  MessageContains(std::initializer_list<std::string> parts) : parts_(parts) {}

  bool match(const std::exception& e) const override {
    const std::string what = e.what();
    for (const auto& p : parts_)
      if (what.find(p) == std::string::npos) return false;
    return true;
  }
  std::string describe() const override {
    std::string d = "has a message containing";
    for (const auto& p : parts_) d += " \"" + p + "\"";
    return d;
  }

 private:
  std::vector<std::string> parts_;
};

}  // namespace dtrain_test
