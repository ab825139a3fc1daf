// SPDX-License-Identifier: Apache-2.0
#pragma once
// What the checkpoint tests share: a sandbox directory that runs the scenarios program, a field of
// its RESULT line, bitwise comparison of saved parameters, and a manifest re-sealed over an edit.

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <dtrain/checkpointer/files.hpp>

#include "../dtrain_catch.hpp"
#include "../run_command.hpp"

namespace dtrain_test {

namespace fs = std::filesystem;
using Run = CommandResult;

// A fresh directory per test.
struct Sandbox {
  fs::path dir;
  Sandbox() {
    std::random_device rd;
    dir = fs::temp_directory_path() / ("dtrain_checkpoint_" + std::to_string(rd()) + std::to_string(getpid()));
    fs::create_directories(dir);
  }
  // Removed with the test: hundreds of runs must not fill the machine's temporary directory.
  ~Sandbox() {
    std::error_code ignored;
    fs::remove_all(dir, ignored);
  }
  Sandbox(const Sandbox&) = delete;
  Sandbox& operator=(const Sandbox&) = delete;
  fs::path storage() const { return dir / "runs"; }
  fs::path run(const std::string& name) const { return storage() / name; }
  fs::path file(const std::string& name) const { return dir / name; }

  // Runs the scenarios program in the sandbox; stdout and stderr together.
  Run scenario(const std::string& args, const std::string& env = "") const {
    return run_command("cd '" + dir.string() + "' && " + env + " '" + SCENARIOS_BIN + "' --storage '" +
                       storage().string() + "' " + args);
  }
};

// The value of `key=` on the scenario's output (its RESULT line, or STATS).
inline std::string field(const std::string& out, const std::string& key) {
  const auto at = out.find(" " + key + "=");
  REQUIRE(at != std::string::npos);
  const auto begin = at + key.size() + 2;
  return out.substr(begin, out.find_first_of(" \n", begin) - begin);
}

inline std::vector<torch::Tensor> load_params(const fs::path& p) {
  std::vector<torch::Tensor> v;
  torch::load(v, p.string());
  return v;
}

// Bitwise: same shapes, dtypes and every element equal.
inline bool same_params(const fs::path& a, const fs::path& b) {
  const auto x = load_params(a), y = load_params(b);
  if (x.size() != y.size() || x.empty()) return false;
  for (std::size_t i = 0; i < x.size(); ++i)
    if (x[i].scalar_type() != y[i].scalar_type() || !torch::equal(x[i], y[i])) return false;
  return true;
}

// Re-seals checkpoint `ck`'s manifest over its edited `file` (size and CRC-32), as a tool that
// rewrites a checkpoint would: the checkpoint verifies again.
inline void reseal(const fs::path& ck, const std::string& file) {
  auto manifest = nlohmann::json::parse(std::ifstream(ck / "manifest.json"));
  for (auto& f : manifest["files"])
    if (f["name"] == file) {
      f["size"] = fs::file_size(ck / file);
      f["crc32"] = dtrain::checkpointer::detail::crc32_of_file(ck / file).first;
    }
  std::ofstream(ck / "manifest.json") << manifest.dump();
}

}  // namespace dtrain_test
