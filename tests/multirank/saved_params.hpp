// SPDX-License-Identifier: Apache-2.0
#pragma once
// The parameters a scenario saved (torch::save of a std::vector<torch::Tensor>), read back to be
// compared bitwise.
#include <filesystem>
#include <vector>

#include <torch/serialize.h>

namespace dtrain_test {

inline std::vector<torch::Tensor> load_params(const std::filesystem::path& path) {
  std::vector<torch::Tensor> params;
  torch::load(params, path.string());
  return params;
}

}  // namespace dtrain_test
