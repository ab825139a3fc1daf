// SPDX-License-Identifier: Apache-2.0
// Every Strategy and every Tracker policy through its category's law checker, with Trainers whose
// driver is the test process.

#include "strategy.hpp"
#include "tracker.hpp"

namespace st = dtrain::strategy;

// ---- Strategies ---------------------------------------------------------------------------------

TEST_CASE("strategy ddp: 2 and 3 workers equal 1", "[laws][strategy]") { dtrain_laws::strategy::check<st::ddp<>>(); }

TEST_CASE("strategy fsdp full_shard: 2 and 3 workers equal 1", "[laws][strategy]") {
  dtrain_laws::strategy::check<st::fsdp<>>();
}

TEST_CASE("strategy fsdp shard_grad_op: 2 and 3 workers equal 1", "[laws][strategy]") {
  dtrain_laws::strategy::check<st::fsdp<st::sharding::shard_grad_op, st::wrap::whole_model>>();
}

// ---- Trackers -----------------------------------------------------------------------------------

TEST_CASE("tracker directory: called directly", "[laws][tracker]") {
  dtrain_laws::tracker::check_calls<dtrain::tracker::directory>();
}
TEST_CASE("tracker mlflow: called directly", "[laws][tracker]") {
  dtrain_laws::tracker::check_calls<dtrain::tracker::mlflow<>>();
}
TEST_CASE("tracker tensorboard: called directly", "[laws][tracker]") {
  dtrain_laws::tracker::check_calls<dtrain::tracker::tensorboard<>>();
}
TEST_CASE("tracker tensorboard over mlflow: called directly", "[laws][tracker]") {
  dtrain_laws::tracker::check_calls<dtrain::tracker::tensorboard<dtrain::tracker::mlflow<>>>();
}
TEST_CASE("tracker none: called directly", "[laws][tracker]") { dtrain_laws::tracker::check_calls<dtrain::tracker::none>(); }

TEST_CASE("tracker directory: started once and ended once by the driver", "[laws][tracker]") {
  dtrain_laws::tracker::check_driven<dtrain::tracker::directory>();
}
TEST_CASE("tracker mlflow: started once and ended once by the driver", "[laws][tracker]") {
  dtrain_laws::tracker::check_driven<dtrain::tracker::mlflow<>>();
}
TEST_CASE("tracker tensorboard: started once and ended once by the driver", "[laws][tracker]") {
  dtrain_laws::tracker::check_driven<dtrain::tracker::tensorboard<>>();
}
TEST_CASE("tracker tensorboard over mlflow: started once and ended once by the driver", "[laws][tracker]") {
  dtrain_laws::tracker::check_driven<dtrain::tracker::tensorboard<dtrain::tracker::mlflow<>>>();
}
TEST_CASE("tracker none: started once and ended once by the driver", "[laws][tracker]") {
  dtrain_laws::tracker::check_driven<dtrain::tracker::none>();
}
