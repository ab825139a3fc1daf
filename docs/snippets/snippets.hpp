// SPDX-License-Identifier: Apache-2.0
#pragma once
// What the documentation's C++ blocks take as given: a network `Net` and the Fashion-MNIST splits
// `data`. Each block is a marked region (// [name] ... // [name]) of a file in this directory;
// tests/docs/check_docs.py fails unless every ```cpp block of README.md and docs/*.md appears in a
// compiled file, and tests/docs/CMakeLists.txt runs each program and checks what it prints.

#include <dtrain/all.hpp>
#include <dtrain/weights.hpp>

#include <cstdint>
#include <filesystem>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

namespace snippets {

/// The docs' network: a small MLP over 28x28 images, which describes itself (guide.md, "Serving
/// and batch inference"): every checkpoint saves its Config.
// [model config]
struct NetConfig {
  std::int64_t hidden = 64, classes = 10;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(NetConfig, hidden, classes)  // the Config as JSON, both ways

struct NetImpl : torch::nn::Module {
  using Config = NetConfig;
  explicit NetImpl(const Config& c = {})
      : config(c),
        fc1(register_module("fc1", torch::nn::Linear(784, c.hidden))),
        fc2(register_module("fc2", torch::nn::Linear(c.hidden, c.classes))) {}
  torch::Tensor forward(torch::Tensor x) { return fc2(torch::relu(fc1(x.flatten(1)))); }
  Config config;  // what the model was built from: ctx.checkpoint() saves it
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Net);
// [model config]

/// The first 1,024 training and 512 test images of Fashion-MNIST, so that a block that trains for
/// 10 epochs runs in seconds. Shaped like data::FashionMnist: train() and test().
struct SmallFashionMnist {
  dtrain::data::TensorDataset train_, test_;
  const dtrain::data::TensorDataset& train() const { return train_; }
  const dtrain::data::TensorDataset& test() const { return test_; }

  static SmallFashionMnist load() {
    const auto all = dtrain::data::FashionMnist::load();
    auto first = [](const dtrain::data::NormalizedImages& d, std::int64_t n) {
      const auto b = d.get_batch(torch::arange(n));
      return dtrain::data::TensorDataset{b.data, b.target};
    };
    return {first(all.train(), 1024), first(all.test(), 512)};
  }
};

/// A fresh directory for a block's runs ("runs" relative to it), so that a second run of the test
/// does not resume from the first one's checkpoints.
inline void fresh_directory(const std::filesystem::path& dir) {
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::filesystem::current_path(dir);
}

int guide(const std::string& block);
int checkpoints(const std::string& block);
int data_page(const std::string& block);

}  // namespace snippets
