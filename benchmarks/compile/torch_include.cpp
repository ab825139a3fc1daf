// SPDX-License-Identifier: Apache-2.0
// benchmarks/compile_time.py: what including LibTorch costs (the reference of dtrain_include.cpp).
#include <torch/torch.h>

int main() {}
