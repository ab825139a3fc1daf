// SPDX-License-Identifier: Apache-2.0
// Every Backend policy that runs here through the backend law checker, on 1, 2 and 3 processes,
// on both of gloo's paths. backend::nccl runs the same checker in tests/gpu (it needs a GPU per rank).

#include "backend.hpp"

#include <dtrain/backend/gloo.hpp>

using dtrain_laws::backend::placement;

TEST_CASE("backend gloo on one host: the shared-memory path", "[laws][backend]") {
  for (const int world : {1, 2, 3}) dtrain_laws::backend::check<dtrain::backend::gloo>(world, placement::one_host);
}

TEST_CASE("backend gloo with a host per rank: Gloo's TCP transport", "[laws][backend]") {
  for (const int world : {2, 3}) dtrain_laws::backend::check<dtrain::backend::gloo>(world, placement::host_per_rank);
}

TEST_CASE("backend gloo with one worker thread", "[laws][backend]") {
  dtrain_laws::backend::check<dtrain::backend::gloo_with_threads<1>>(3, placement::host_per_rank);
}
