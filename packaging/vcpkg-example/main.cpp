// SPDX-License-Identifier: Apache-2.0
// The vcpkg example's program: the samples rank 1 of 2 reads in epoch 0 under dtrain's default
// sampler. `main [label]` prints them after the label.
#include <dtrain/dtrain.hpp>

#include <cstdio>

int main(int argc, char** argv) {
  const auto mine = dtrain::sampler::distributed<>::indices(/*size*/ 10, /*rank*/ 1, /*world*/ 2, /*epoch*/ 0);
  std::printf("dtrain %d.%d.%d (%s): rank 1 of 2 reads %zu of 10 samples, DTRAIN_WITH_CUDA=%d\n",
              DTRAIN_VERSION_MAJOR, DTRAIN_VERSION_MINOR, DTRAIN_VERSION_PATCH,
              argc > 1 ? argv[1] : "vcpkg", mine.size(), DTRAIN_WITH_CUDA);
  return mine.size() == 5 ? 0 : 1;
}
