// SPDX-License-Identifier: Apache-2.0
// A loop that evaluates with ctx.shard (the Trainer's Sampler) between training and its
// checkpoints: the checkpoint keeps the training shard's position, a resume gives it back to the
// training shard alone, and killed, resumed and uninterrupted runs end bitwise equal.

#include "sandbox.hpp"

#include <fstream>
#include <regex>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

namespace {

using dtrain_test::field;
using dtrain_test::same_params;
using dtrain_test::Sandbox;

// The batch counts rank 0 printed for its evaluations ("EVAL batches=K"), each once.
std::set<std::string> eval_batch_counts(const std::string& output) {
  std::set<std::string> counts;
  const std::regex line("EVAL batches=([0-9]+)");
  for (auto it = std::sregex_iterator(output.begin(), output.end(), line); it != std::sregex_iterator(); ++it)
    counts.insert((*it)[1].str());
  return counts;
}

}  // namespace

TEST_CASE("evaluation_shard_keeps_the_training_position: killed and resumed runs that evaluate before each checkpoint end bitwise equal") {
  Sandbox box;
  // 1024 samples at 32 a step: 32 steps an epoch. The held-out set (200 samples, 7 batches a
  // rank) is evaluated at each epoch's start and before each checkpoint.
  auto ref = box.scenario("--name eref --steps 40 --every 5 --eval 1 --out eref.pt");
  INFO(ref.output);
  REQUIRE(ref.status == 0);
  REQUIRE(field(ref.output, "restarts") == "0");
  REQUIRE(eval_batch_counts(ref.output) == std::set<std::string>{"7"});
  // The checkpoint at step 20 holds the training shard's place (20 of its 32 batches, of 1024
  // samples), not the evaluation's.
  const auto rank0 = nlohmann::json::parse(std::ifstream(box.run("eref") / "checkpoint_000004" / "rank_00000.json"));
  CHECK(rank0["epoch"] == 0);
  CHECK(rank0["position"] == 20);
  CHECK(rank0["samples"] == 1024);

  // --kill-settled 1: the checkpoints in flight are written first, so the one resumed from is known.
  SECTION("a worker killed mid-epoch, after a checkpoint in mid-epoch") {
    auto r = box.scenario("--name kill23 --steps 40 --every 5 --eval 1 --kill-step 23 --kill-settled 1 --max-failures 1 --out kill23.pt");
    INFO(r.output);
    REQUIRE(r.status == 0);
    CHECK(field(r.output, "restarts") == "1");
    CHECK_THAT(r.output, Catch::Contains("RESUMED") && Catch::Contains("steps=20"));
    CHECK(same_params(box.file("eref.pt"), box.file("kill23.pt")));
    CHECK(field(r.output, "rows") == "8");
    CHECK(field(r.output, "eval_loss") == field(ref.output, "eval_loss"));
    CHECK(eval_batch_counts(r.output) == std::set<std::string>{"7"});  // every evaluation saw every batch
  }
  SECTION("a worker killed in the next epoch, after a checkpoint at an epoch's end") {
    // A checkpoint every 8 steps: the one at step 32 follows the epoch's last batch and an evaluation.
    auto r = box.scenario("--name kill37 --steps 40 --every 8 --eval 1 --kill-step 37 --kill-settled 1 --max-failures 1 --out kill37.pt");
    INFO(r.output);
    REQUIRE(r.status == 0);
    CHECK(field(r.output, "restarts") == "1");
    CHECK_THAT(r.output, Catch::Contains("RESUMED") && Catch::Contains("steps=32"));
    CHECK(same_params(box.file("eref.pt"), box.file("kill37.pt")));
    CHECK(field(r.output, "rows") == "5");
    CHECK(field(r.output, "eval_loss") == field(ref.output, "eval_loss"));
    CHECK(eval_batch_counts(r.output) == std::set<std::string>{"7"});
  }
  SECTION("a run stopped after 22 steps and run again to 40") {
    auto first = box.scenario("--name lim --steps 22 --every 5 --eval 1 --final 1");
    INFO(first.output);
    REQUIRE(first.status == 0);
    auto r = box.scenario("--name lim --steps 40 --every 5 --eval 1 --out lim.pt");
    INFO(r.output);
    REQUIRE(r.status == 0);
    CHECK_THAT(r.output, Catch::Contains("RESUMED") && Catch::Contains("steps=22"));
    CHECK(same_params(box.file("eref.pt"), box.file("lim.pt")));
    CHECK(field(r.output, "eval_loss") == field(ref.output, "eval_loss"));
    CHECK(eval_batch_counts(r.output) == std::set<std::string>{"7"});
  }
}

TEST_CASE("resumed_position_taken_by_an_evaluation_is_refused: an evaluation over a split of the training split's size") {
  Sandbox box;
  // The held-out set has the training set's 1024 samples and is evaluated first in each epoch:
  // after the resume it takes the position, and the first training step says so.
  auto first = box.scenario("--name same --steps 22 --every 5 --eval 1 --eval-samples 1024 --final 1");
  INFO(first.output);
  REQUIRE(first.status == 0);
  auto r = box.scenario("--name same --steps 40 --every 5 --eval 1 --eval-samples 1024");
  INFO(r.output);
  CHECK(r.status == 3);
  CHECK_THAT(r.output, Catch::Contains("22 batches into epoch 0 of a split of 1024 samples") &&
                           Catch::Contains("dtrain::sampler::sequential{}"));
}
