// SPDX-License-Identifier: Apache-2.0
// Multi-process tests of the data layer: data_scenarios is a real driver with real workers over
// Gloo on loopback, training on batches of named fields; these tests run it and read its output.

#include "../dtrain_catch.hpp"
#include "../run_command.hpp"
#include "../scratch.hpp"
#include "saved_params.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <torch/torch.h>

namespace fs = std::filesystem;

namespace {

struct DataRun {
  int status = -1;
  std::string output;
  fs::path dir;
};

// Runs data_scenarios in a fresh directory; returns its exit status and everything it printed.
DataRun data_scenario(const std::string& args) {
  std::random_device rd;
  const std::string tag = "d" + std::to_string(rd()) + std::to_string(::getpid());
  DataRun r;
  r.dir = dtrain_test::scratch_directory("dtrain_data_multirank_" + tag);
  auto run = dtrain_test::run_command("cd '" + r.dir.string() + "' && '" + DATA_SCENARIOS_BIN + "' " + args + " --tag " + tag);
  r.status = run.status;
  r.output = std::move(run.output);
  return r;
}

std::string field(const std::string& out, const std::string& key) {
  const auto at = out.find(" " + key + "=");
  REQUIRE(at != std::string::npos);
  const auto from = at + key.size() + 2;
  return out.substr(from, out.find_first_of(" \n", from) - from);
}

using dtrain_test::load_params;

}  // namespace

// The loss sums per-sample losses, not per-rank means (a mean of the ranks' means would weigh the
// samples of 9 and 8 batches on 2 workers unequally). It equals one process's up to the forward's
// own rounding: OpenBLAS's sgemm kernels for AVX-512 CPUs round a row's result differently in
// batches of 6 than of 12 or 4 (one float32 ulp of one sample's loss, 1e-9 of the mean).
TEST_CASE("validate: accuracy is identical and the loss equal within the forward's rounding on 1 2 and 3 workers under ddp and fsdp", "[multirank][data]") {
  for (const std::string strategy : {"ddp", "fsdp"}) {
    std::vector<std::string> loss, accuracy;
    for (int workers : {1, 2, 3}) {
      INFO(strategy << " with " << workers << " workers");
      const auto r = data_scenario("validate --workers " + std::to_string(workers) + " --strategy " + strategy);
      INFO(r.output);
      REQUIRE(r.status == 0);
      CHECK(field(r.output, "samples") == "97");
      CHECK(field(r.output, "cm_total") == "97");
      CHECK(std::isfinite(std::stod(field(r.output, "trained_loss"))));  // ctx.forward(model, ids, mask) trained
      loss.push_back(field(r.output, "loss"));
      accuracy.push_back(field(r.output, "accuracy"));
    }
    CHECK(std::stod(loss[1]) == Approx(std::stod(loss[0])).epsilon(1e-7));
    CHECK(std::stod(loss[2]) == Approx(std::stod(loss[0])).epsilon(1e-7));
    CHECK(accuracy[0] == accuracy[1]);
    CHECK(accuracy[0] == accuracy[2]);
  }
}

TEST_CASE("pipeline: a run killed mid-epoch and resumed is bitwise equal to an uninterrupted one", "[multirank][data]") {
  // The reference on the training thread alone; the killed run with 3 loader threads: the batches
  // (and their random draws) must not depend on either.
  const auto ref = data_scenario("pipeline --workers 2 --loader-threads 0 --steps 14 --every 4 --out ref.pt");
  INFO(ref.output);
  REQUIRE(ref.status == 0);
  const auto killed = data_scenario("pipeline --workers 2 --loader-threads 3 --steps 14 --every 4 --kill-step 10 --out killed.pt");
  INFO(killed.output);
  REQUIRE(killed.status == 0);
  CHECK(field(killed.output, "restarts") == "1");
  CHECK(killed.output.find("RESUMED ") != std::string::npos);
  const auto a = load_params(ref.dir / "ref.pt"), b = load_params(killed.dir / "killed.pt");
  REQUIRE(a.size() == b.size());
  REQUIRE(!a.empty());
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(torch::equal(a[i], b[i]));
}

// A stage that builds a model (map_batches<Embedder>: its constructor initialises Linear layers,
// its calls add noise) before a head with dropout: the stage draws from generators of its own,
// never from the default one the head's dropout uses, so thread timing changes nothing.
TEST_CASE("stage: a model-holding stage leaves the training generator alone: runs at concurrency 1 and 2 are bitwise equal", "[multirank][data][stage]") {
  std::vector<std::vector<torch::Tensor>> runs;
  for (const int concurrency : {1, 2})
    for (int run = 0; run < 3; ++run) {
      INFO("concurrency " << concurrency << ", run " << run);
      const auto r = data_scenario("stage --workers 2 --loader-threads 3 --concurrency " + std::to_string(concurrency) +
                                   " --steps 14 --every 4 --out p.pt");
      INFO(r.output);
      REQUIRE(r.status == 0);
      runs.push_back(load_params(r.dir / "p.pt"));
      REQUIRE(runs.back().size() == runs.front().size());
      REQUIRE(!runs.back().empty());
      for (std::size_t i = 0; i < runs.front().size(); ++i) CHECK(torch::equal(runs.front()[i], runs.back()[i]));
    }
}

TEST_CASE("stage: a run with a model-holding stage killed mid-epoch and resumed is bitwise equal to an uninterrupted one", "[multirank][data][stage]") {
  // The reference builds the stage on the training thread; the killed runs on loader threads, once
  // (concurrency 1) or twice per attempt (concurrency 2).
  const auto ref = data_scenario("stage --workers 2 --loader-threads 0 --steps 14 --every 4 --out ref.pt");
  INFO(ref.output);
  REQUIRE(ref.status == 0);
  const auto a = load_params(ref.dir / "ref.pt");
  REQUIRE(!a.empty());
  for (const int concurrency : {1, 2}) {
    INFO("concurrency " << concurrency);
    const auto killed = data_scenario("stage --workers 2 --loader-threads 3 --concurrency " + std::to_string(concurrency) +
                                      " --steps 14 --every 4 --kill-step 10 --out killed.pt");
    INFO(killed.output);
    REQUIRE(killed.status == 0);
    CHECK(field(killed.output, "restarts") == "1");
    CHECK(killed.output.find("RESUMED ") != std::string::npos);
    const auto b = load_params(killed.dir / "killed.pt");
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i) CHECK(torch::equal(a[i], b[i]));
  }
}
