// SPDX-License-Identifier: Apache-2.0
#pragma once
// The Fashion-MNIST example's two models, the ones the PyTorch peer defines layer for layer
// (benchmarks/peers/fashion_mnist.py, Python DDP over Gloo). Shared with benchmarks/torch_floor.cpp, whose startup
// floor runs the same first step without dtrain.
#include <string>

#include <nlohmann/json.hpp>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/pooling.h>

inline torch::nn::Sequential make_fashion_mnist_model(const std::string& name) {
  using namespace torch::nn;
  if (name == "cnn")
    return Sequential(Conv2d(Conv2dOptions(1, 32, 3).padding(1)), ReLU(), MaxPool2d(2),
                      Conv2d(Conv2dOptions(32, 64, 3).padding(1)), ReLU(), MaxPool2d(2), Flatten(),
                      Linear(64 * 7 * 7, 128), ReLU(), Dropout(0.25), Linear(128, 10));
  return Sequential(Flatten(), Linear(28 * 28, 256), BatchNorm1d(256), ReLU(), Dropout(0.3), Linear(256, 10));
}

// The same Sequential (its parameters named 0.weight, 1.weight, ... as the peer's), describing
// itself: every checkpoint saves its Config, so a Predictor rebuilds it from the checkpoint alone.
struct FashionMnistConfig {
  std::string model = "mlp";  // "mlp" or "cnn"
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(FashionMnistConfig, model)

struct FashionMnistNetImpl : torch::nn::SequentialImpl {
  using Config = FashionMnistConfig;
  explicit FashionMnistNetImpl(const Config& c) : config(c) {
    const auto layers = make_fashion_mnist_model(c.model);
    for (const auto& layer : *layers) push_back(layer);
  }
  Config config;
};
TORCH_MODULE(FashionMnistNet);
