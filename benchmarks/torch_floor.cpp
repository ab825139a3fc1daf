// SPDX-License-Identifier: Apache-2.0
// The startup floor (issue 15): what any LibTorch program pays before it does work on this machine,
// timed from its own process start (the kernel's record, as the example's startup_s uses).
//
//   torch_floor                          loads LibTorch and adds two tensors: {"load_s": ...}
//   torch_floor --model cnn|mlp --batch N  then also builds the example's model and takes one Adam
//                                        step on a random batch of N, one intra-op thread, as a
//                                        worker's first step: {"load_s": ..., "first_step_s": ...}
//
// The second is the floor of the example's startup_s for that model with N samples per worker:
// the first convolutions (oneDNN's kernels generated, their buffers faulted in) are LibTorch's.
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/adam.h>

#include <dtrain/launch/process.hpp>

#include "../examples/fashion_mnist_models.hpp"

namespace {

double since(double start) {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count() - start;
}

int usage(const char* why) {
  std::fprintf(stderr, "torch_floor: %s\nusage: torch_floor [--model cnn|mlp --batch N]\n", why);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  const double start = dtrain::launch::process_start_unix();
  std::string model_name;
  long batch = 0;
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) return usage((flag + " needs a value").c_str());
    const std::string value = argv[i + 1];
    if (flag == "--model" && (value == "cnn" || value == "mlp")) model_name = value;
    else if (flag == "--batch") {
      char* end = nullptr;
      errno = 0;
      batch = std::strtol(value.c_str(), &end, 10);
      if (errno != 0 || *end != '\0' || batch < 1 || batch > 65536) return usage("--batch must be 1 to 65536");
    } else return usage(("unknown flag or value: " + flag + " " + value).c_str());
  }
  if (model_name.empty() != (batch == 0)) return usage("--model and --batch go together");
  const at::Tensor sum = at::ones({2}) + at::ones({2});
  const double load_s = since(start);
  if (model_name.empty()) {
    std::printf("{\"load_s\": %.3f, \"sum\": %.1f}\n", load_s, sum.sum().item<float>());
    return 0;
  }
  at::set_num_threads(1);
  auto model = make_fashion_mnist_model(model_name);
  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(1e-3));
  const auto x = torch::rand({batch, 1, 28, 28});
  const auto y = torch::randint(10, {batch});
  adam.zero_grad();
  torch::nn::functional::cross_entropy(model->forward(x), y).backward();
  adam.step();
  std::printf("{\"load_s\": %.3f, \"first_step_s\": %.3f}\n", load_s, since(start));
}
