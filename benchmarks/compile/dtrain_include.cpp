// SPDX-License-Identifier: Apache-2.0
// benchmarks/compile_time.py: what including a training program's umbrella costs, against
// torch_include.cpp.
#include <dtrain/dtrain.hpp>

int main() {}
