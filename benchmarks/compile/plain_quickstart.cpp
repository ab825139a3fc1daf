// SPDX-License-Identifier: Apache-2.0
// benchmarks/compile_time.py's reference: examples/quickstart.cpp's work in plain LibTorch (an MLP
// on Fashion-MNIST-shaped batches, Adam, a loop of epochs and batches, the loss printed): what a
// training program costs to compile without dtrain. Compiled, never run.
#include <cstdint>
#include <iostream>

#include <torch/torch.h>

int main() {
  using namespace torch::nn;
  Sequential model(Flatten(), Linear(784, 256), ReLU(), Linear(256, 10));
  torch::optim::Adam adam(model->parameters(), 1e-3);
  const auto images = torch::rand({60000, 1, 28, 28});
  const auto labels = torch::randint(10, {60000});
  for (int epoch = 0; epoch < 2; ++epoch) {
    double loss_sum = 0;
    std::int64_t batches = 0;
    for (std::int64_t first = 0; first < images.size(0); first += 128) {
      const auto x = images.slice(0, first, first + 128), y = labels.slice(0, first, first + 128);
      adam.zero_grad();
      auto loss = functional::cross_entropy(model->forward(x), y);
      loss.backward();
      adam.step();
      loss_sum += loss.item<double>();
      ++batches;
    }
    std::cout << "epoch " << epoch << ", loss " << loss_sum / batches << '\n';
  }
}
