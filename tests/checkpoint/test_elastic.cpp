// SPDX-License-Identifier: Apache-2.0
// Elastic groups and launched runs: the checkpoint scenarios program under dtrain's driver with a
// worker that cannot be brought back, and under torchrun-style variables and a real torchrun.

#include "../dtrain_catch.hpp"
#include "../run_command.hpp"
#include "../loopback_port.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

namespace fs = std::filesystem;

namespace {

struct Box {
  fs::path dir;
  Box() {
    std::random_device rd;
    dir = fs::temp_directory_path() / ("dtrain_elastic_" + std::to_string(rd()) + std::to_string(getpid()));
    fs::create_directories(dir);
  }
  fs::path storage() const { return dir / "runs"; }
  fs::path run(const std::string& name) const { return storage() / name; }
  std::string bin(const std::string& args) const {
    return "'" + std::string(SCENARIOS_BIN) + "' --storage '" + storage().string() + "' " + args;
  }
  // Runs a shell command in the box; its output (stdout and stderr) and exit status.
  std::pair<int, std::string> shell(const std::string& command) const {
    auto r = dtrain_test::run_command("cd '" + dir.string() + "' && (" + command + ")");
    return {r.status, std::move(r.output)};
  }
  nlohmann::json outcome(const std::string& name) const {
    std::ifstream in(run(name) / "outcome.json");
    REQUIRE(in);
    return nlohmann::json::parse(in);
  }
};

// Two ranks under torchrun's variables on loopback, each alone on its "host"; prints "status A B".
std::string launched_pair(const Box& box, const std::string& args) {
  const auto port = dtrain_test::free_loopback_port();
  auto rank = [&](int r) {
    return "env RANK=" + std::to_string(r) + " LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 GROUP_RANK=" + std::to_string(r) +
           " WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + port + " " + box.bin(args);
  };
  return box.shell(rank(0) + " & a=$!; " + rank(1) + "; b=$?; wait $a; a=$?; echo status $a $b").second;
}

}  // namespace

namespace {
// 1008 samples, 48 a step: 21 steps an epoch. Rank 2 dies after step 4 in attempts 0 and 1 (the
// restart brings nothing back), so attempt 2 runs 2 workers from the checkpoint at step 3; after
// its second checkpoint (step 9) the group grows back to 3, which ends the epoch at step 21.
// `extra`: more flags for the scenario (the Strategy).
void shrink_and_grow_back(const std::string& extra) {
  Box box;
  const auto trace = box.dir / "trace";
  fs::create_directories(trace);
  auto [status, out] = box.shell(box.bin(
      "--name el --workers 3 --min-workers 2 --regrow-after 2 --batch 48 --every 3 --steps 21 --kill-rank 2 "
      "--kill-step 4 --kill-attempts 2 --kill-settled 1 --max-failures 3 --trace '" + trace.string() + "'" + extra));
  INFO(out);
  REQUIRE(status == 0);
  CHECK_THAT(out, Catch::Contains("continuing with 2 workers") && Catch::Contains("grows back to 3"));
  CHECK_THAT(out, Catch::Contains("restarts=2") && Catch::Contains("groups=3@0:start;3@3:restart;2@3:shrink;3@9:grow;"));

  const auto o = box.outcome("el");
  CHECK(o["status"] == "finished");
  CHECK(o["restarts"] == 2);
  REQUIRE(o["groups"].size() == 4);
  const std::vector<std::pair<int, std::string>> sizes = {{3, "start"}, {3, "restart"}, {2, "shrink"}, {3, "grow"}};
  for (std::size_t g = 0; g < sizes.size(); ++g) {
    CHECK(o["groups"][g]["attempt"] == static_cast<int>(g));
    CHECK(o["groups"][g]["world_size"] == sizes[g].first);
    CHECK(o["groups"][g]["reason"] == sizes[g].second);
  }

  // The samples whose training the final model keeps: each group's up to the step the next group
  // resumed from (a failed group's steps after its last checkpoint are trained again).
  std::map<std::int64_t, int> seen;
  std::map<std::string, std::int64_t> kept;
  for (const auto& f : fs::directory_iterator(trace)) {
    const auto name = f.path().filename().string();  // w<world>_a<attempt>_r<rank>
    const int attempt = std::stoi(name.substr(name.find("_a") + 2));
    const auto& groups = o["groups"];
    const std::int64_t until = attempt + 1 < static_cast<int>(groups.size())
                                   ? groups[attempt + 1]["step"].get<std::int64_t>()
                                   : std::numeric_limits<std::int64_t>::max();
    std::ifstream in(f.path());
    std::int64_t epoch = 0, index = 0, step = 0;
    kept[name];
    while (in >> epoch >> index >> step) {
      CHECK(epoch == 0);
      if (step > until) continue;
      ++seen[index];
      ++kept[name];
    }
  }
  CHECK(kept == std::map<std::string, std::int64_t>{{"w3_a0_r0", 48},  {"w3_a0_r1", 48},  {"w3_a0_r2", 48},
                                                    {"w3_a1_r0", 0},   {"w3_a1_r1", 0},   {"w3_a1_r2", 0},
                                                    {"w2_a2_r0", 144}, {"w2_a2_r1", 144}, {"w3_a3_r0", 192},
                                                    {"w3_a3_r1", 192}, {"w3_a3_r2", 192}});
  CHECK(seen.size() == 1008);
  for (const auto& [index, count] : seen) {
    INFO("sample " << index);
    CHECK(count == 1);
  }
  fs::remove_all(box.dir);
}

}  // namespace

TEST_CASE("elastic_group_shrinks_and_grows_back: a worker that fails again after its restart is dropped until the smaller group checkpoints") {
  shrink_and_grow_back("");
}

// strategy::fsdp<>: each change of count re-cuts the sharded SGD momentum (3 -> 2 -> 3 ranks).
TEST_CASE("elastic_group_shrinks_and_grows_back_under_fsdp: the sharded optimizer state is re-cut at each change of count") {
  shrink_and_grow_back(" --fsdp 1");
}

TEST_CASE("elastic_range_is_validated: min_workers outside 1..num_workers names the fix") {
  Box box;
  auto [status, out] = box.shell(box.bin("--name bad --workers 2 --min-workers 3 --steps 2"));
  CHECK(status == 3);
  CHECK_THAT(out, Catch::Contains("ScalingConfig::min_workers is 3 with num_workers 2") &&
                      Catch::Contains("1 <= min_workers <= num_workers"));
  fs::remove_all(box.dir);
}

TEST_CASE("fresh_start_under_a_launcher: rank 0 moves the earlier run aside before any rank reads it") {
  Box box;
  auto [first, out1] = box.shell(box.bin("--name lf --workers 2 --steps 10 --every 5"));
  INFO(out1);
  REQUIRE(first == 0);
  const auto out = launched_pair(box, "--name lf --steps 10 --every 5 --fresh 1");
  INFO(out);
  CHECK_THAT(out, Catch::Contains("status 0 0") && Catch::Contains("the earlier run was moved to") &&
                      !Catch::Contains("RESUMED"));
  int old_runs = 0;
  for (const auto& e : fs::directory_iterator(box.storage()))
    if (e.path().filename().string().rfind("lf.old-", 0) == 0) {
      ++old_runs;
      CHECK(fs::exists(e.path() / "outcome.json"));
    }
  CHECK(old_runs == 1);
  const auto o = box.outcome("lf");
  CHECK(o["status"] == "finished");
  REQUIRE(o["groups"].size() == 1);
  CHECK(o["groups"][0]["step"] == 0);  // a fresh run, not the earlier one resumed
  fs::remove_all(box.dir);
}

TEST_CASE("launched_rank_0_killed: the restarted group's rank 0 records the attempt whose rank 0 died") {
  Box box;
  // torchrun (of the torch that is this build's LibTorch: DTRAIN_TORCH_PYTHON) on loopback, 2
  // workers, one restart; rank 0 kills itself after step 7 in the first group (the checkpoint at
  // step 5 complete), so nobody writes that group's end.
  const std::string torchrun = std::string(TORCH_PYTHON) +
                               " -m torch.distributed.run --standalone --nnodes 1 --nproc_per_node 2 --max_restarts 1 "
                               "--monitor_interval 0.2 --redirects 2 --tee 2 --no_python ";
  auto [status, out] = box.shell(torchrun + box.bin("--name k0 --steps 12 --every 5 --kill-rank 0 --kill-step 7 "
                                                    "--kill-settled 1"));
  INFO(out);
  REQUIRE(status == 0);
  const auto o = box.outcome("k0");
  CHECK(o["status"] == "finished");
  CHECK(o["restarts"] == 1);
  REQUIRE(o["failures"].size() == 1);
  CHECK(o["failures"][0]["attempt"] == 0);
  CHECK(o["failures"][0]["resumed_step"] == 5);
  CHECK_THAT(o["failures"][0]["cause"].get<std::string>(), Catch::Contains("without its rank 0 recording why"));
  REQUIRE(o["groups"].size() == 2);
  CHECK(o["groups"][1]["reason"] == "restart");
  CHECK(o["groups"][1]["step"] == 5);
  fs::remove_all(box.dir);
}
