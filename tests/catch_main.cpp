// SPDX-License-Identifier: Apache-2.0
// Catch's main, and the end of a test program's scratch directories (scratch.hpp).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "scratch.hpp"

int main(int argc, char* argv[]) {
  const int failed = Catch::Session().run(argc, argv);
  dtrain_test::finish_scratch_directories(failed == 0);
  return failed;
}
