// SPDX-License-Identifier: Apache-2.0
// The startup floor (issue 15): a program that only loads LibTorch and adds two tensors. It prints
// the seconds from its own process start (the kernel's record, as the example's startup_s uses) to
// the sum being computed: what any LibTorch program pays before it can do work on this machine.
#include <cstdio>

#include <ATen/ATen.h>

#include <dtrain/launch/process.hpp>

int main() {
  const double start = dtrain::launch::process_start_unix();
  const at::Tensor sum = at::ones({2}) + at::ones({2});
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::printf("{\"load_s\": %.3f, \"sum\": %.1f}\n", now - start, sum.sum().item<float>());
}
