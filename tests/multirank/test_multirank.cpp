// SPDX-License-Identifier: Apache-2.0
// Multi-process tests: the scenarios program is a real driver with real workers over Gloo on
// loopback; these tests run it and check its output, exit status, files and leftover processes.

#include "../dtrain_catch.hpp"
#include "../loopback_port.hpp"
#include "../run_command.hpp"
#include "../scratch.hpp"
#include "saved_params.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/torch.h>

namespace fs = std::filesystem;

namespace {

using Run = dtrain_test::CommandResult;

std::string unique_tag() {
  std::random_device rd;
  return "t" + std::to_string(rd()) + std::to_string(getpid());
}

// The test's directory for the scenarios' files and what they write (scratch.hpp: removed when the
// test program passes).
fs::path scratch(const std::string& tag) { return dtrain_test::scratch_directory("dtrain_multirank_" + tag); }

// Runs the scenarios program in a fresh directory with `env` prefixed; returns exit status and
// everything it printed. Every run carries a unique --tag so leftover processes can be found.
Run scenario(const std::string& args, const std::string& tag, const std::string& env = "") {
  const fs::path dir = scratch(tag);
  return dtrain_test::run_command("cd '" + dir.string() + "' && " + env + " '" + SCENARIOS_BIN + "' " + args +
                                  " --tag " + tag);
}

// Processes whose command line carries `tag`.
int processes_with(const std::string& tag) {
  int n = 0;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const auto name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(e.path() / "cmdline", std::ios::binary);
    std::string cmdline((std::istreambuf_iterator<char>(in)), {});
    // A zombie has an empty cmdline: count this test's own unreaped children through their stat
    // ("pid (comm) Z ppid ..."), not the zombies of tests running beside it.
    std::ifstream status(e.path() / "stat");
    std::string stat((std::istreambuf_iterator<char>(status)), {});
    const auto state = stat.rfind(") ");
    if (cmdline.find(tag) != std::string::npos) ++n;
    else if (cmdline.empty() && state != std::string::npos && stat.compare(state + 2, 2, "Z ") == 0 &&
             std::atoi(stat.c_str() + state + 4) == static_cast<int>(::getpid()))
      ++n;
  }
  return n;
}

double metric(const std::string& out, const std::string& key) {
  const auto at = out.find(" " + key + "=");
  REQUIRE(at != std::string::npos);
  return std::stod(out.substr(at + key.size() + 2));
}

using dtrain_test::load_params;

}  // namespace

TEST_CASE("2 workers give the parameters of 1 worker on the same samples", "[multirank][ddp][quick]") {
  const auto tag = unique_tag();
  const fs::path one = scratch(tag) / (tag + "_1.pt"), two = scratch(tag) / (tag + "_2.pt");
  auto r1 = scenario("equivalence --workers 1 --batch 32 --steps 6 --out " + one.string(), tag);
  INFO(r1.output);
  REQUIRE(r1.status == 0);
  auto r2 = scenario("equivalence --workers 2 --batch 32 --steps 6 --out " + two.string(), tag);
  INFO(r2.output);
  REQUIRE(r2.status == 0);
  CHECK(metric(r2.output, "ranks_agree") == 1);
  const auto a = load_params(one), b = load_params(two);
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double rel = ((a[i] - b[i]).abs().max() / a[i].abs().max().clamp_min(1e-12)).item<double>();
    CHECK(rel < 1e-5);
  }
  // The first step moved the weights: the comparison is not between two untouched models.
  CHECK(metric(r2.output, "synced_steps") == 6);
}

TEST_CASE("a sparse embedding trains to the dense one's parameters on 1 and 2 workers, reducing only the rows looked up", "[multirank][ddp][sparse]") {
  const auto tag = unique_tag();
  auto params_of = [&](const std::string& variant, int workers, const std::string& strategy) {
    const fs::path out = scratch(tag) / (tag + "_" + variant + std::to_string(workers) + strategy + ".pt");
    auto r = scenario("embedding --variant " + variant + " --workers " + std::to_string(workers) + " --strategy " +
                          strategy + " --batch 8 --steps 8 --out " + out.string(), tag);
    INFO(r.output);
    REQUIRE(r.status == 0);
    CHECK(metric(r.output, "steps_taken") == 8);
    if (strategy == "ddp") CHECK(metric(r.output, "ranks_agree") == 1);
    if (variant == "sparse" && strategy == "ddp") {
      // The gradient stayed sparse through backward and the reduction, and 8 steps of 4 rows
      // of 6 ids per worker (seeded) never cover the 64-row table.
      CHECK(metric(r.output, "grad_sparse") == 1);
      CHECK(metric(r.output, "rows_reduced") > 0);
      CHECK(metric(r.output, "rows_reduced") < 64);
    }
    return load_params(out);
  };
  auto same = [](const std::vector<torch::Tensor>& sparse, const std::vector<torch::Tensor>& dense) {
    REQUIRE(sparse.size() == dense.size());
    for (std::size_t i = 0; i < sparse.size(); ++i)
      CHECK(((sparse[i] - dense[i]).abs().max() / dense[i].abs().max()).item<double>() < 1e-5);
  };
  for (int workers : {1, 2}) {
    INFO(workers << " workers under ddp");
    same(params_of("sparse", workers, "ddp"), params_of("dense", workers, "ddp"));
  }
  INFO("2 workers under fsdp: the sparse gradient joins the flat one");
  same(params_of("sparse", 2, "fsdp"), params_of("dense", 2, "fsdp"));
}

TEST_CASE("workers started as fresh processes (threads_per_worker > 1) train the same", "[multirank][exec]") {
  const auto tag = unique_tag();
  const fs::path one = scratch(tag) / (tag + "_1.pt"), two = scratch(tag) / (tag + "_2.pt");
  auto r1 = scenario("equivalence --workers 1 --steps 4 --out " + one.string(), tag);
  REQUIRE(r1.status == 0);
  auto r2 = scenario("equivalence --workers 2 --threads 2 --steps 4 --out " + two.string(), tag);
  INFO(r2.output);
  REQUIRE(r2.status == 0);
  const auto a = load_params(one), b = load_params(two);
  for (std::size_t i = 0; i < a.size(); ++i)
    CHECK(((a[i] - b[i]).abs().max() / a[i].abs().max()).item<double>() < 1e-5);
}

TEST_CASE("the first bucket's allreduce starts before backward ends", "[multirank][ddp]") {
  const auto tag = unique_tag();
  auto r = scenario("overlap --workers 2 --steps 3", tag);
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK(metric(r.output, "buckets") >= 2);
  // Gradients were still outstanding when bucket 0 went out: communication overlapped backward.
  CHECK(metric(r.output, "grads_pending_at_first_launch") > 0);
}

TEST_CASE("report and all_reduce are synchronised steps - rank 0's metrics are recorded", "[multirank][report]") {
  const auto tag = unique_tag();
  auto r = scenario("report --workers 2 --steps 2 --storage " + (scratch(tag) / "runs").string(), tag);
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK(metric(r.output, "sum") == 3);
  CHECK(metric(r.output, "mean") == 1.5);
  CHECK(metric(r.output, "max") == 2);
  CHECK(metric(r.output, "rank") == 0);
  CHECK(metric(r.output, "world") == 2);
  CHECK(metric(r.output, "rows") == 1);
  const auto run_dir = scratch(tag) / "runs" / "report";
  CHECK(fs::exists(run_dir / "metrics.csv"));
  CHECK(fs::exists(run_dir / "metrics.jsonl"));
}

TEST_CASE("no_sync accumulates locally and synchronises every other backward", "[multirank][ddp]") {
  const auto tag = unique_tag();
  auto r = scenario("no_sync --workers 2 --steps 6", tag);
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK(metric(r.output, "synced_steps") == 3);
  CHECK(metric(r.output, "ranks_agree") == 1);
}

TEST_CASE("a worker that throws stops the run with its rank and message - nothing is left", "[multirank][failure]") {
  const auto tag = unique_tag();
  auto r = scenario("throw --workers 2", tag);
  INFO(r.output);
  CHECK(r.status == 3);
  CHECK_THAT(r.output, Catch::Contains("rank 1") && Catch::Contains("boom at step 3"));
  CHECK(processes_with(tag) == 0);
}

TEST_CASE("a worker killed by SIGKILL stops the run naming rank and signal - nothing is left", "[multirank][failure]") {
  const auto tag = unique_tag();
  auto r = scenario("sigkill --workers 2", tag);
  INFO(r.output);
  CHECK(r.status == 3);
  CHECK_THAT(r.output, Catch::Contains("rank 1 was killed by signal 9"));
  CHECK(processes_with(tag) == 0);
}

TEST_CASE("a rank that skips report() gets an error, not a hang", "[multirank][report]") {
  const auto tag = unique_tag();
  auto r = scenario("skip_report --workers 2 --steps 2", tag);
  INFO(r.output);
  CHECK(r.status == 3);
  CHECK_THAT(r.output, Catch::Contains("report()"));
  CHECK(processes_with(tag) == 0);
}

TEST_CASE("a rank that skips report() and trains on is named within seconds, not at the timeout", "[multirank][report]") {
  const auto tag = unique_tag();
  const auto start = std::chrono::steady_clock::now();
  auto r = scenario("skip_report_midway --workers 2 --steps 8", tag);
  const auto seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  INFO(r.output);
  CHECK(r.status == 3);
  CHECK_THAT(r.output, Catch::Contains("rank 1 went on past report() call 1 without it") &&
                           Catch::Contains("while rank 0 waits at report() call 1"));
  // The collective timeout is the default 300 s, and the group fails (and is restarted, and fails
  // again) in a few seconds: each detection takes about a second (the heartbeat's interval).
  CHECK(seconds < 30);
  CHECK(processes_with(tag) == 0);
}

TEST_CASE("a loop that steps without backward is told so once, with the fix", "[multirank][ddp]") {
  const auto tag = unique_tag();
  const std::string warning = "none of the optimizer's 6 parameters has a gradient";
  auto r = scenario("no_backward --workers 2 --steps 4", tag);
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK_THAT(r.output, Catch::Contains("ctx.step(optimizer) at step 1: " + warning) &&
                           Catch::Contains("Call ctx.backward(loss)"));
  CHECK(r.output.find(warning) == r.output.rfind(warning));  // once: rank 0, the first step
  auto trained = scenario("equivalence --workers 2 --steps 4", tag);
  INFO(trained.output);
  CHECK(trained.status == 0);
  CHECK_THAT(trained.output, !Catch::Contains("has a gradient"));
}

TEST_CASE("bad configurations fail before training with a clear error", "[multirank][config]") {
  const auto tag = unique_tag();
  SECTION("a global batch the workers do not divide") {
    auto r = scenario("equivalence --workers 2 --batch 33", tag);
    CHECK(r.status == 3);
    CHECK_THAT(r.output, Catch::Contains("does not divide evenly among 2 workers"));
  }
  SECTION("num_workers < 1") {
    auto r = scenario("equivalence --workers 0", tag);
    CHECK(r.status == 3);
    CHECK_THAT(r.output, Catch::Contains("num_workers is 0"));
  }
  CHECK(processes_with(tag) == 0);
}

TEST_CASE("a MASTER_PORT in use is reported, naming the port", "[multirank][rendezvous]") {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = 0;
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(listen(fd, 1) == 0);
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const int port = ntohs(addr.sin_port);
  const auto tag = unique_tag();
  auto r = scenario("equivalence --workers 2", tag, "MASTER_PORT=" + std::to_string(port));
  close(fd);
  INFO(r.output);
  CHECK(r.status == 3);
  CHECK_THAT(r.output, Catch::Contains("port " + std::to_string(port)) && Catch::Contains("in use"));
  // Issue 30: c10d's glog lines (two warnings and an error) came before dtrain's message: noise.
  CHECK_THAT(r.output, !Catch::Contains("[c10d]") && !Catch::Contains("InitGoogleLogging"));
  CHECK(processes_with(tag) == 0);
}

TEST_CASE("a rendezvous that never completes names the missing ranks", "[multirank][rendezvous]") {
  // Rank 0 of 3 under an external launcher's variables: ranks 1 and 2 never come.
  const std::string port = dtrain_test::free_loopback_port();  // rank 0 hosts the store there
  const auto tag = unique_tag();
  auto r = scenario("equivalence --rendezvous-ms 1500", tag, "RANK=0 WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + port);
  INFO(r.output);
  CHECK(r.status == 1);
  CHECK_THAT(r.output, Catch::Contains("rank(s) 1, 2 of world size 3 never arrived"));
}

TEST_CASE("killing the driver takes its workers with it", "[multirank][failure]") {
  const auto tag = unique_tag();
  const fs::path dir = scratch(tag);
  const pid_t driver = fork();
  REQUIRE(driver >= 0);
  if (driver == 0) {
    chdir(dir.c_str());
    execl(SCENARIOS_BIN, SCENARIOS_BIN, "hang", "--workers", "2", "--tag", tag.c_str(), nullptr);
    _exit(127);
  }
  // Driver plus two workers.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (processes_with(tag) < 3 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  REQUIRE(processes_with(tag) == 3);
  kill(driver, SIGKILL);
  int st = 0;
  waitpid(driver, &st, 0);
  const auto gone = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (processes_with(tag) > 0 && std::chrono::steady_clock::now() < gone)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK(processes_with(tag) == 0);
}

// ---- strategy::fsdp<>: sharded parameters, gradients and optimizer state ----

TEST_CASE("gloo's flat allgather and emulated reduce_scatter give exact results", "[multirank][collectives]") {
  const auto tag = unique_tag();
  for (const int workers : {2, 3}) {
    auto r = scenario("collectives --workers " + std::to_string(workers), tag);
    INFO(r.output);
    REQUIRE(r.status == 0);
    CHECK(metric(r.output, "collectives_ok") == 1);
  }
  // Gloo's own path: two ranks under an external launcher's variables, each alone on its "host"
  // (LOCAL_WORLD_SIZE=1), so the shared-memory channel stays off. A wrong result exits with 1.
  const std::string port = dtrain_test::free_loopback_port();
  auto rank = [&](int r) {
    return "env RANK=" + std::to_string(r) + " LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 GROUP_RANK=" + std::to_string(r) +
           " WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + port + " '" + SCENARIOS_BIN + "' collectives --tag " + tag;
  };
  const std::string cmd = "cd '" + scratch(tag).string() + "' && (" +
                          rank(0) + " & a=$!; " + rank(1) + "; b=$?; wait $a; a=$?; echo status $a $b)";
  const std::string out = dtrain_test::run_command(cmd).output;
  INFO(out);
  CHECK_THAT(out, Catch::Contains("status 0 0"));
}

namespace {
// Largest elementwise difference relative to the largest magnitude, over every tensor.
void check_close(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b, double tol) {
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    INFO("tensor " << i);
    REQUIRE(a[i].sizes() == b[i].sizes());
    const double rel = ((a[i] - b[i]).abs().max() / a[i].abs().max().clamp_min(1e-12)).item<double>();
    CHECK(rel <= tol);
  }
}

std::string latest_of(const std::string& out) {
  const auto at = out.find(" latest=");
  REQUIRE(at != std::string::npos);
  const auto end = out.find_first_of(" \n", at + 8);
  return out.substr(at + 8, end - at - 8);
}
}  // namespace

TEST_CASE("fsdp<> trains to the parameters ddp<> gives within 1e-5 relative", "[multirank][fsdp][quick]") {
  const auto tag = unique_tag();
  const auto tmp = scratch(tag);
  // Adam (state per shard), BatchNorm buffers, 8 steps; --accumulate adds no_sync micro-batches.
  for (const std::string extra : {"", " --accumulate 1"}) {
    std::vector<std::vector<torch::Tensor>> got;
    for (const std::string strategy : {"ddp", "fsdp", "fsdp_grad_op"}) {
      const auto out = tmp / (tag + "_" + strategy + ".pt");
      auto r = scenario("fsdp_train --strategy " + strategy + " --workers 2 --steps 8 --out " + out.string() + extra, tag);
      INFO(strategy << extra << ": " << r.output);
      REQUIRE(r.status == 0);
      CHECK(metric(r.output, "synced_steps") == (extra.empty() ? 8 : 5));
      // Between forward and backward (2122 parameters, 1061 per rank, fp32): full_shard holds
      // only its shards; shard_grad_op also the full parameters and the flat gradients.
      if (strategy == "fsdp") CHECK(metric(r.output, "held_after_forward") == 1061 * 4);
      if (strategy == "fsdp_grad_op") CHECK(metric(r.output, "held_after_forward") == 1061 * 4 + 2 * 2122 * 4);
      if (strategy == "fsdp") {
        CHECK(metric(r.output, "units") == 4);  // Linear, BatchNorm1d, Linear, Linear
        // full_shard gathers every unit for forward and again for backward (and once for --out).
        CHECK(metric(r.output, "allgathers") == 4 * (2 * 8 + 1));
      }
      if (strategy == "fsdp_grad_op") {
        CHECK(metric(r.output, "units") == 1);
        CHECK(metric(r.output, "allgathers") == 8 + 1);
      }
      got.push_back(load_params(out));
    }
    // The weights moved: the comparison is not between two untouched models.
    CHECK(got[0].size() == 11);  // 8 parameters; BatchNorm's running mean, variance and count
    check_close(got[0], got[1], 1e-5);
    check_close(got[0], got[2], 1e-5);
  }
  // 3 workers: BatchNorm's 64-value unit is padded to 66 (22 per rank).
  std::vector<std::vector<torch::Tensor>> three;
  for (const std::string strategy : {"ddp", "fsdp"}) {
    const auto out = tmp / (tag + "_3_" + strategy + ".pt");
    auto r = scenario("fsdp_train --strategy " + strategy + " --workers 3 --batch 48 --steps 6 --out " + out.string(), tag);
    INFO(strategy << ": " << r.output);
    REQUIRE(r.status == 0);
    three.push_back(load_params(out));
  }
  check_close(three[0], three[1], 1e-5);
}

namespace {
// Whether Optimizer::zero_grad() keeps the gradient tensors, zeroed (LibTorch 1.13), or drops them
// (set_to_none, 2.x): asked of the LibTorch itself.
bool zero_grad_keeps_gradients() {
  auto p = torch::zeros({1}, torch::requires_grad());
  p.mutable_grad() = torch::ones({1});
  torch::optim::SGD opt({p}, torch::optim::SGDOptions(0.1));
  opt.zero_grad();
  return p.grad().defined();
}
}  // namespace

TEST_CASE("fsdp<> holds at most 0.6x ddp<>'s model state on 2 workers and 0.35x on 4 and faults no page in per step", "[multirank][fsdp][memory]") {
  const auto tag = unique_tag();
  auto ddp = scenario("fsdp_memory --strategy ddp --workers 2 --steps 8 --batch 16", tag);
  INFO(ddp.output);
  REQUIRE(ddp.status == 0);
  const double params = metric(ddp.output, "params");
  CHECK(params > 9e6);
  CHECK(params < 11e6);
  // Parameters, Adam's two moments and, where zero_grad() keeps them (LibTorch 1.13), the
  // gradients, fp32: the scenario measures after a step's zero_grad().
  const double ddp_bytes = metric(ddp.output, "state_bytes");
  const int tensors_per_param = zero_grad_keeps_gradients() ? 4 : 3;
  CHECK(ddp_bytes == Approx(tensors_per_param * 4 * params).epsilon(0.01));
  auto two = scenario("fsdp_memory --strategy fsdp --workers 2 --steps 8 --batch 16", tag);
  INFO(two.output);
  REQUIRE(two.status == 0);
  auto four = scenario("fsdp_memory --strategy fsdp --workers 4 --steps 8 --batch 16", tag);
  INFO(four.output);
  REQUIRE(four.status == 0);
  const double r2 = metric(two.output, "state_bytes") / ddp_bytes, r4 = metric(four.output, "state_bytes") / ddp_bytes;
  WARN("fsdp/ddp model state per worker: " << r2 << " on 2 workers, " << r4 << " on 4; peak RSS (MB) ddp "
       << metric(ddp.output, "peak_rss_mb") << ", fsdp 2 " << metric(two.output, "peak_rss_mb") << ", fsdp 4 "
       << metric(four.output, "peak_rss_mb") << "; page faults per step ddp " << metric(ddp.output, "faults_per_step")
       << ", fsdp 2 " << metric(two.output, "faults_per_step") << ", fsdp 4 " << metric(four.output, "faults_per_step"));
  CHECK(r2 <= 0.6);
  CHECK(r4 <= 0.35);
  CHECK(r2 == Approx(0.5).epsilon(0.01));
  CHECK(r4 == Approx(0.25).epsilon(0.01));
  // Each step's full parameters (gathered twice under full_shard) and flat gradients reuse the
  // last step's pages: a step faults in less than a fifth of one copy of the parameters beyond
  // what ddp<> faults in. Mapped afresh each step they were three copies (27,730 pages a step on
  // 2 workers, against about 1,000 kept). Counted over the 6 steps after 2 of warm-up: over 2, one
  // stray mapping (8,194 faults once, under 2.15 with another test beside it) doubled the figure.
  const double pages_of_one_copy = 4 * params / 4096;
  CHECK(metric(two.output, "faults_per_step") < metric(ddp.output, "faults_per_step") + 0.2 * pages_of_one_copy);
  CHECK(metric(four.output, "faults_per_step") < metric(ddp.output, "faults_per_step") + 0.2 * pages_of_one_copy);
}

TEST_CASE("a ddp<> checkpoint loads into fsdp<> and back and fsdp<> resumes from its sharded optimizer state", "[multirank][fsdp][checkpoint][compat]") {
  const auto tag = unique_tag();
  const auto tmp = scratch(tag);
  // Each run its own storage: a run directory with checkpoints would be resumed from.
  int runs = 0;
  auto storage_ = [&] { return " --storage " + (tmp / (tag + "_runs" + std::to_string(++runs))).string(); };
  auto model_pt = [](const std::string& dir) {
    std::ifstream in(fs::path(dir) / "model.pt", std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), {});
    std::map<std::string, torch::Tensor> out;
    for (const auto& kv : torch::jit::pickle_load(bytes).toGenericDict())
      out.emplace(kv.key().toStringRef(), kv.value().toTensor());
    return out;
  };
  auto same = [](const std::map<std::string, torch::Tensor>& a, const std::map<std::string, torch::Tensor>& b) {
    REQUIRE(a.size() == b.size());
    for (const auto& [name, t] : a) {
      INFO(name);
      REQUIRE(b.count(name));
      CHECK(torch::equal(t, b.at(name)));
    }
  };
  // ddp<> trains 4 steps and checkpoints.
  auto a = scenario("fsdp_train --strategy ddp --steps 4 --checkpoint 1" + storage_(), tag);
  INFO(a.output);
  REQUIRE(a.status == 0);
  const auto ck_ddp = latest_of(a.output);
  // fsdp<> loads it (weights only: the optimizers differ) and checkpoints without training: its
  // model.pt, gathered from the shards, is ddp<>'s.
  auto b = scenario("fsdp_train --strategy fsdp --steps 0 --checkpoint 1 --resume-from " + ck_ddp + storage_(), tag);
  INFO(b.output);
  REQUIRE(b.status == 0);
  const auto ck_fsdp = latest_of(b.output);
  CHECK(fs::exists(fs::path(ck_fsdp) / "optimizer_rank_00001.pt"));
  same(model_pt(ck_ddp), model_pt(ck_fsdp));
  // And back: ddp<> loads fsdp<>'s model.pt.
  auto c = scenario("fsdp_train --strategy ddp --steps 0 --checkpoint 1 --resume-from " + ck_fsdp + storage_(), tag);
  INFO(c.output);
  REQUIRE(c.status == 0);
  same(model_pt(ck_ddp), model_pt(latest_of(c.output)));

  // Sharded optimizer state: 4 steps, checkpoint, resume with restore(model, optimizer), 4 more
  // steps, is 8 steps straight.
  const auto straight = tmp / (tag + "_straight.pt"), resumed = tmp / (tag + "_resumed.pt");
  auto s8 = scenario("fsdp_train --strategy fsdp --steps 8 --out " + straight.string() + storage_(), tag);
  REQUIRE(s8.status == 0);
  auto s4 = scenario("fsdp_train --strategy fsdp --steps 4 --checkpoint 1" + storage_(), tag);
  REQUIRE(s4.status == 0);
  auto r4 = scenario("fsdp_train --strategy fsdp --steps 4 --restore all --out " + resumed.string() +
                     " --resume-from " + latest_of(s4.output) + storage_(), tag);
  INFO(r4.output);
  REQUIRE(r4.status == 0);
  check_close(load_params(straight), load_params(resumed), 1e-6);

  // Sharded optimizer state does not load into ddp<>'s optimizer, nor ddp<>'s into fsdp<>'s.
  auto bad = scenario("fsdp_train --strategy ddp --steps 0 --restore all --resume-from " + ck_fsdp + storage_(), tag);
  CHECK(bad.status == 3);
  CHECK_THAT(bad.output, Catch::Contains("sharded over 2 ranks") && Catch::Contains("restore(model)"));
  auto bad2 = scenario("fsdp_train --strategy fsdp --steps 0 --restore all --resume-from " + ck_ddp + storage_(), tag);
  CHECK(bad2.status == 3);
  CHECK_THAT(bad2.output, Catch::Contains("saved whole") && Catch::Contains("load_model(model)"));
  CHECK(processes_with(tag) == 0);
}

TEST_CASE("fsdp<> with an optimizer over model->parameters() fails with a clear error", "[multirank][fsdp][config]") {
  const auto tag = unique_tag();
  auto r = scenario("fsdp_bad_optimizer --workers 2 --steps 2", tag);
  INFO(r.output);
  CHECK(r.status == 3);
  CHECK_THAT(r.output, Catch::Contains("optimizer was built over the model's parameters") &&
                           Catch::Contains("ctx.parameters(model)"));
  CHECK(processes_with(tag) == 0);
}

TEST_CASE("ctx.graphed_step on CPU workers is refused with the fix named", "[multirank][config]") {
  const auto tag = unique_tag();
  auto r = scenario("graphed_on_cpu --workers 1 --steps 2", tag);
  INFO(r.output);
  CHECK(r.status == 3);
  // 1.13: this LibTorch cannot capture; a CUDA build of 2.x: the workers run on cpu.
  CHECK_THAT(r.output, Catch::Contains("ctx.graphed_step: ") && Catch::Contains("step with ctx.backward and ctx.step"));
  CHECK(processes_with(tag) == 0);
}

TEST_CASE("an overflow on one rank makes every rank skip the step and back the loss scale off", "[multirank][amp]") {
  const auto tag = unique_tag();
  auto r = scenario("amp_overflow --workers 2 --steps 6 --storage " + (scratch(tag) / "runs").string(), tag);
  INFO(r.output);
  REQUIRE(r.status == 0);
  // Only rank 1 saw the inf; the found-inf flag is agreed over ranks, so both skipped step 2.
  CHECK(metric(r.output, "skipped_min") == 1);
  CHECK(metric(r.output, "skipped_max") == 1);
  CHECK(metric(r.output, "ranks_agree") == 1);
  // The metrics rows carry the skip count and the scale: 2^16 halved once.
  CHECK(metric(r.output, "skipped_steps") == 1);
  CHECK(metric(r.output, "loss_scale") == 32768);
}

TEST_CASE("a prefetching shard trains exactly as the plain one and counts the batches the loop got", "[multirank][prefetch]") {
  const auto tag = unique_tag();
  const fs::path plain = scratch(tag) / (tag + "_plain.pt"),
                 ahead = scratch(tag) / (tag + "_prefetch.pt");
  auto r1 = scenario("equivalence --workers 2 --steps 6 --out " + plain.string(), tag);
  INFO(r1.output);
  REQUIRE(r1.status == 0);
  auto r2 = scenario("prefetch --workers 2 --steps 6 --out " + ahead.string(), tag);
  INFO(r2.output);
  REQUIRE(r2.status == 0);  // the scenario throws if sampler_position() counted the batch read ahead
  const auto a = load_params(plain), b = load_params(ahead);
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(torch::equal(a[i], b[i]));
}

namespace {
std::string text_field(const std::string& out, const std::string& key) {
  const auto at = out.find(" " + key + "=");
  REQUIRE(at != std::string::npos);
  const auto begin = at + key.size() + 2;
  return out.substr(begin, out.find_first_of(" \n", begin) - begin);
}
}  // namespace

TEST_CASE("an evaluation split over 2 or 3 workers equals the 1-worker one exactly", "[multirank][evaluation]") {
  const auto tag = unique_tag();
  std::vector<Run> runs;
  std::vector<fs::path> outs;
  for (auto [workers, batch] : {std::pair{1, 200}, std::pair{2, 200}, std::pair{3, 201}}) {
    outs.push_back(scratch(tag) / (tag + "_eval" + std::to_string(workers) + ".pt"));
    runs.push_back(scenario("evaluate --workers " + std::to_string(workers) + " --batch " + std::to_string(batch) +
                                " --out " + outs.back().string(),
                            tag));
    INFO(runs.back().output);
    REQUIRE(runs.back().status == 0);
  }
  const auto& one = runs[0].output;
  CHECK(text_field(one, "predicted") == "1001");
  CHECK(text_field(one, "predicted_equals_cm") == "1");
  CHECK(text_field(one, "label0").size() == 1);  // no class names given: "0" .. "9"
  torch::Tensor p1;
  torch::load(p1, outs[0].string());
  REQUIRE(p1.sizes() == torch::IntArrayRef({1001, 10}));
  CHECK(p1.sum(1).sub(1).abs().max().item<double>() < 1e-5);  // probabilities
  for (std::size_t i = 1; i < runs.size(); ++i) {
    INFO(runs[i].output);
    // The matrix and every metric from it: the same text, so the same double to the last digit.
    for (const char* key : {"cm", "eval_accuracy", "eval_precision_macro", "eval_recall_macro", "eval_f1_macro",
                            "eval_precision_weighted", "eval_recall_weighted", "eval_f1_weighted", "hand_cm",
                            "predicted", "label0"})
      CHECK(text_field(runs[i].output, key) == text_field(one, key));
    // The predictions come back in the dataset's order.
    torch::Tensor pn;
    torch::load(pn, outs[i].string());
    REQUIRE(pn.sizes() == p1.sizes());
    CHECK(torch::equal(pn.argmax(1), p1.argmax(1)));
    CHECK((pn - p1).abs().max().item<double>() < 1e-5);
  }
}

TEST_CASE("metrics reduced across workers match a hand-computed case", "[multirank][evaluation]") {
  // truth i % 3, prediction (i / 2) % 3 for i = 0..9, split over 2 workers:
  //   counts[t][p] = [[2, 2, 0], [2, 0, 1], [0, 2, 1]]
  //   precision 2/4, 0/4, 1/2; recall 2/4, 0/3, 1/3; F1 0.5, 0, 0.4; support 4, 3, 3
  const auto tag = unique_tag();
  auto r = scenario("evaluate --workers 2 --batch 200", tag);
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK(text_field(r.output, "hand_cm") == "2,2,0,2,0,1,0,2,1");
  CHECK(metric(r.output, "hand_accuracy") == Approx(0.3));
  CHECK(metric(r.output, "hand_precision_macro") == Approx(1.0 / 3));
  CHECK(metric(r.output, "hand_recall_macro") == Approx((0.5 + 0 + 1.0 / 3) / 3));
  CHECK(metric(r.output, "hand_f1_macro") == Approx(0.3));
  CHECK(metric(r.output, "hand_precision_weighted") == Approx(0.35));
  CHECK(metric(r.output, "hand_recall_weighted") == Approx(0.3));
  CHECK(metric(r.output, "hand_f1_weighted") == Approx(0.32));
}

namespace {
// The fsdp_train model's units (Linear 20x32, BatchNorm1d 32, Linear 32x32, Linear 32x10): values
// each, in the order fsdp<> gives them to the optimizer.
const std::vector<std::int64_t> fsdp_train_units{672, 64, 1056, 330};

// A checkpoint's fsdp<> optimizer state as the whole model's: every optimizer_rank_RRRRR.pt read,
// each unit's state tensors joined over the ranks, and `padding` (per unit: the values past the
// unit's own, which must be zeros); the scalars (Adam's step) of every rank and unit.
struct FullOptimizerState {
  std::map<std::string, std::vector<torch::Tensor>> tensors;  // name -> unit -> values
  std::vector<std::int64_t> steps;
  std::vector<torch::Tensor> padding;
};
FullOptimizerState full_optimizer_state(const fs::path& ck, int world) {
  FullOptimizerState out;
  std::map<std::string, std::vector<std::vector<torch::Tensor>>> pieces;  // name -> unit -> rank
  for (int r = 0; r < world; ++r) {
    char name[64];
    std::snprintf(name, sizeof name, "optimizer_rank_%05d.pt", r);
    torch::serialize::InputArchive archive, state, groups, group;
    archive.load_from((ck / name).string());
    archive.read("state", state);
    archive.read("param_groups", groups);
    groups.read("param_groups/0", group);
    for (std::size_t u = 0; u < fsdp_train_units.size(); ++u) {
      c10::IValue key;
      group.read("params/" + std::to_string(u), key);
      torch::serialize::InputArchive one;
      state.read(key.toStringRef(), one);
      for (const auto& field : one.keys()) {
        c10::IValue v;
        one.read(field, v);
        if (v.isTensor()) {
          auto& by_unit = pieces[field];
          by_unit.resize(fsdp_train_units.size());
          by_unit[u].push_back(v.toTensor());
        } else {
          out.steps.push_back(v.toInt());
        }
      }
    }
  }
  for (auto& [field, by_unit] : pieces)
    for (std::size_t u = 0; u < by_unit.size(); ++u) {
      const auto joined = torch::cat(by_unit[u]);
      const auto n = fsdp_train_units[u];
      out.tensors[field].push_back(joined.narrow(0, 0, n));
      out.padding.push_back(joined.narrow(0, n, joined.numel() - n));
    }
  return out;
}
}  // namespace

// issue 13: a run of another worker count re-cuts fsdp<>'s sharded optimizer state (it was a
// ConfigError, and before that, issue 18, LibTorch's size mismatch).
TEST_CASE("fsdp_checkpoint_reshards_for_another_worker_count: 2 -> 3 -> 2 workers keep the full model and Adam state bitwise", "[multirank][fsdp][checkpoint]") {
  const std::string tag = unique_tag();
  const auto tmp = scratch(tag);
  int runs = 0;
  auto storage_ = [&] { return " --storage " + (tmp / (tag + "_runs" + std::to_string(++runs))).string(); };
  auto run = [&](const std::string& args) {
    auto r = scenario("fsdp_train --strategy fsdp --batch 48 " + args + storage_(), tag);
    INFO(args << ": " << r.output);
    REQUIRE(r.status == 0);
    return r;
  };
  // 2 workers train 4 steps and checkpoint; 3 workers resume (the BatchNorm unit's 64 values are
  // padded to 66 there) and checkpoint without training; 2 workers resume from that.
  const auto ck2 = latest_of(run("--workers 2 --steps 4 --checkpoint 1").output);
  const auto ck3 = latest_of(run("--workers 3 --steps 0 --checkpoint 1 --restore all --resume-from " + ck2).output);
  const auto ck2b = latest_of(run("--workers 2 --steps 0 --checkpoint 1 --restore all --resume-from " + ck3).output);
  CHECK(fs::exists(fs::path(ck3) / "optimizer_rank_00002.pt"));
  const auto before = full_optimizer_state(ck2, 2), at3 = full_optimizer_state(ck3, 3), back = full_optimizer_state(ck2b, 2);
  REQUIRE(before.tensors.size() == 2);  // exp_avg, exp_avg_sq
  for (const auto* other : {&at3, &back}) {
    REQUIRE(other->tensors.size() == before.tensors.size());
    for (const auto& [field, units] : before.tensors)
      for (std::size_t u = 0; u < units.size(); ++u) {
        INFO(field << " of unit " << u);
        CHECK(torch::equal(units[u], other->tensors.at(field)[u]));
        CHECK(units[u].abs().sum().item<double>() > 0);
      }
    for (const auto& pad : other->padding) CHECK(torch::equal(pad, torch::zeros_like(pad)));
  }
  CHECK(at3.padding[1].numel() == 2);  // the BatchNorm unit, 66 - 64
  CHECK(before.steps == std::vector<std::int64_t>(8, 4));  // 4 units x 2 ranks, each at step 4
  CHECK(at3.steps == std::vector<std::int64_t>(12, 4));
  CHECK(back.steps == before.steps);
  auto model_pt = [](const std::string& dir) {
    std::ifstream in(fs::path(dir) / "model.pt", std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), {});
    return torch::jit::pickle_load(bytes).toGenericDict();
  };
  const auto m2 = model_pt(ck2), m3 = model_pt(ck3), m2b = model_pt(ck2b);
  REQUIRE(m2.size() == 11);
  for (const auto& kv : m2) {
    INFO(kv.key().toStringRef());
    CHECK(torch::equal(kv.value().toTensor(), m3.at(kv.key()).toTensor()));
    CHECK(torch::equal(kv.value().toTensor(), m2b.at(kv.key()).toTensor()));
  }

  // The run goes on: 3 workers resumed from the 2 workers' checkpoint train 4 steps exactly as 3
  // workers resumed from the 3 workers' one (its state loaded without re-cutting), and not as 3
  // workers that restored the weights only (so the optimizer state was there and mattered).
  const auto resharded = tmp / (tag + "_resharded.pt"), direct = tmp / (tag + "_direct.pt"),
             weights = tmp / (tag + "_weights.pt");
  auto r = run("--workers 3 --steps 4 --restore all --resume-from " + ck2 + " --out " + resharded.string());
  CHECK(metric(r.output, "steps_taken") == 4);
  CHECK(metric(r.output, "synced_steps") == 4);
  run("--workers 3 --steps 4 --restore all --resume-from " + ck3 + " --out " + direct.string());
  run("--workers 3 --steps 4 --restore weights --resume-from " + ck2 + " --out " + weights.string());
  const auto a = load_params(resharded), b = load_params(direct), c = load_params(weights);
  REQUIRE(a.size() == b.size());
  bool differs_from_fresh_optimizer = false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    INFO("tensor " << i);
    CHECK(torch::equal(a[i], b[i]));
    differs_from_fresh_optimizer = differs_from_fresh_optimizer || !torch::equal(a[i], c[i]);
  }
  CHECK(differs_from_fresh_optimizer);
  CHECK(processes_with(tag) == 0);
}

// ---- collectives that cannot be silently mismatched ----

namespace {
// Two ranks of `args` under an external launcher's variables, each alone on its "host"
// (LOCAL_WORLD_SIZE=1): the shared-memory channel stays off and every collective goes over Gloo.
// With `stopped_rank_1`, rank 1 is expected to stop itself (SIGSTOP): once rank 0 has ended, it
// is killed, and only rank 0's status is printed.
std::string launched_pair(const std::string& args, const std::string& tag, bool stopped_rank_1 = false) {
  const std::string port = dtrain_test::free_loopback_port();
  const fs::path dir = scratch(tag);
  auto rank = [&](int r) {
    return "env RANK=" + std::to_string(r) + " LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 GROUP_RANK=" + std::to_string(r) +
           " WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + port + " '" + SCENARIOS_BIN + "' " + args +
           " --tag " + tag;
  };
  const std::string cmd =
      "cd '" + dir.string() + "' && (" +
      (stopped_rank_1 ? rank(1) + " & b=$!; " + rank(0) + "; a=$?; kill -9 $b; wait $b; echo status $a"
                      : rank(0) + " & a=$!; " + rank(1) + "; b=$?; wait $a; a=$?; echo status $a $b") +
      ")";
  return dtrain_test::run_command(cmd).output;
}
}  // namespace

TEST_CASE("ranks that issue different collectives fail at once naming both calls", "[multirank][collectives][mismatch]") {
  const auto tag = unique_tag();
  const std::string allgather = "allgather of 1 Double value (collective #2)",
                    sum = "allreduce(sum) of 1 Double value (collective #2)";
  SECTION("shared memory: a flat allgather against ctx.all_reduce(42.0 sum)") {
    const auto start = std::chrono::steady_clock::now();
    auto r = scenario("mismatch --variant allgather_vs_sum --workers 2", tag);
    INFO(r.output);
    CHECK(r.status == 3);
    CHECK_THAT(r.output, Catch::Contains("collectives do not match") && Catch::Contains(allgather) &&
                             Catch::Contains(sum));
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(15));  // not the 20 s timeout
  }
  SECTION("shared memory: the same operation with another element count") {
    auto r = scenario("mismatch --variant count --workers 3", tag);
    INFO(r.output);
    CHECK(r.status == 3);
    CHECK_THAT(r.output, Catch::Contains("allreduce(sum) of 3 Double values (collective #2)") &&
                             Catch::Contains("allreduce(sum) of 1 Double value (collective #2)"));
  }
  SECTION("Gloo's path checked through shared memory: a list allgather against a max allreduce") {
    auto r = scenario("mismatch --variant gloo_path --workers 2", tag);
    INFO(r.output);
    CHECK(r.status == 3);
    CHECK_THAT(r.output, Catch::Contains("allgather of 2 Long values (collective #2)") &&
                             Catch::Contains("allreduce(max) of 1 Double value (collective #2)"));
  }
  SECTION("Gloo alone (one rank per host): a flat allgather against ctx.all_reduce(42.0 sum)") {
    const auto out = launched_pair("mismatch --variant allgather_vs_sum", tag);
    INFO(out);
    CHECK_THAT(out, Catch::Contains("status 1 1"));  // a worker that failed exits 1
    CHECK_THAT(out, Catch::Contains("rank 0 called " + allgather + " while rank 1 called " + sum));
    CHECK_THAT(out, Catch::Contains("rank 1 called " + sum + " while rank 0 called " + allgather));
  }
  SECTION("Gloo alone: the same operation with another element count") {
    const auto out = launched_pair("mismatch --variant count", tag);
    INFO(out);
    CHECK_THAT(out, Catch::Contains("status 1 1"));  // a worker that failed exits 1
    CHECK_THAT(out, Catch::Contains("allreduce(sum) of 3 Double values (collective #2)"));
  }
  CHECK(processes_with(tag) == 0);
}

// ---- the hierarchical allreduce (ranks on several hosts) ----

namespace {
// Four ranks of `args` under an external launcher's variables, two "hosts" of two ranks told apart by
// DTRAIN_HOST_ID (its documented use: ranks with the same value share a host's shared memory), so the
// communicator builds its hierarchy on loopback. `env` adds variables (NAME=VALUE ...). Prints every
// rank's output, then "status A B C D".
std::string launched_two_hosts(const std::string& args, const std::string& tag, const std::string& env = "") {
  const std::string port = dtrain_test::free_loopback_port();
  const fs::path dir = scratch(tag);
  std::string cmd = "cd '" + dir.string() + "' && (";
  for (int r = 0; r < 4; ++r)
    cmd += "env RANK=" + std::to_string(r) + " LOCAL_RANK=" + std::to_string(r % 2) + " LOCAL_WORLD_SIZE=2 GROUP_RANK=" +
           std::to_string(r / 2) + " WORLD_SIZE=4 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + port + " DTRAIN_HOST_ID=host" +
           std::to_string(r / 2) + " " + env + " '" + SCENARIOS_BIN + "' " + args + " --tag " + tag + " & p" + std::to_string(r) +
           "=$!; ";
  cmd += "s=; for p in $p0 $p1 $p2 $p3; do wait $p; s=\"$s $?\"; done; echo status$s)";
  return dtrain_test::run_command(cmd).output;
}
}  // namespace

TEST_CASE("the hierarchical allreduce over two hosts sums in rank order and checks every call", "[multirank][collectives][hierarchical]") {
  const auto tag = unique_tag();
  SECTION("results bitwise equal to the rank-order sum; the other collectives exact beside it") {
    const auto out = launched_two_hosts("hierarchical", tag);
    INFO(out);
    CHECK_THAT(out, Catch::Contains("dtrain: hierarchical allreduce over 2 hosts (ranks 0-1, 2-3)"));
    CHECK_THAT(out, Catch::Contains("HIERARCHICAL ok allreduces=13 fewest=13"));  // 12 checked + the ctx.all_reduce
    CHECK_THAT(out, Catch::Contains("status 0 0 0 0"));
  }
  const std::string allgather = "allgather of 1 Double value (collective #2)",
                    sum = "allreduce(sum) of 1 Double value (collective #2)";
  SECTION("a host's ranks in different collectives: found on the host") {
    const auto out = launched_two_hosts("mismatch --variant allgather_vs_sum", tag);
    INFO(out);
    CHECK_THAT(out, Catch::Contains("status 1 1 1 1"));
    CHECK_THAT(out, Catch::Contains("rank 0 called " + allgather + " while rank 1 called " + sum));
    CHECK_THAT(out, Catch::Contains("rank 1 called " + sum + " while rank 0 called " + allgather));
  }
  SECTION("on the second host: its errors name the group's ranks, not the host's") {
    const auto out = launched_two_hosts("mismatch --variant last_rank", tag);
    INFO(out);
    CHECK_THAT(out, Catch::Contains("status 1 1 1 1"));
    CHECK_THAT(out, Catch::Contains("rank 3 called " + allgather + " while rank 2 called " + sum));
    CHECK_THAT(out, Catch::Contains("rank 2 called " + sum + " while rank 3 called " + allgather));
  }
  SECTION("the hosts in different collectives: found by the leaders, and told to the host's other rank") {
    const auto out = launched_two_hosts("mismatch --variant by_host", tag);
    INFO(out);
    CHECK_THAT(out, Catch::Contains("status 1 1 1 1"));
    CHECK_THAT(out, Catch::Contains("rank 0 called " + allgather + " while rank 2 called " + sum));
    CHECK_THAT(out, Catch::Contains("rank 1 called " + allgather + " while rank 2 called " + sum));
    CHECK_THAT(out, Catch::Contains("rank 2 called " + sum + " while rank 0 called " + allgather));
  }
  SECTION("DTRAIN_HIERARCHICAL=0 keeps every collective on the flat Gloo group") {
    const auto out = launched_two_hosts("hierarchical", tag, "DTRAIN_HIERARCHICAL=0");
    INFO(out);
    CHECK_THAT(out, !Catch::Contains("dtrain: hierarchical allreduce"));
    CHECK_THAT(out, Catch::Contains("HIERARCHICAL ok allreduces=0 fewest=0"));
    CHECK_THAT(out, Catch::Contains("status 0 0 0 0"));
  }
  CHECK(processes_with(tag) == 0);
}

// ---- hangs that name the rank ----

TEST_CASE("a rank stopped by SIGSTOP is named with its host within the heartbeat timeout and the group restarts", "[multirank][failure][heartbeat]") {
  const auto tag = unique_tag();
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  for (const std::string where : {"sigstop", "sigstop_report"}) {
    INFO(where);
    const auto start = std::chrono::steady_clock::now();
    auto r = scenario(where + " --workers 2", tag);
    const auto took = std::chrono::steady_clock::now() - start;
    INFO(r.output);
    CHECK(r.status == 0);
    CHECK_THAT(r.output, Catch::Contains("restarts=1"));
    CHECK_THAT(r.output, Catch::Contains("rank 1 on " + std::string(host) + " (pid ") &&
                             Catch::Contains("has shown no sign of life"));
    // The collective (in the loop) or the report the others waited at, named.
    if (where == "sigstop") CHECK_THAT(r.output, Catch::Contains("allreduce(mean) of"));
    else CHECK_THAT(r.output, Catch::Contains("waits at report() call"));
    // A 2 s heartbeat timeout plus the restart, far below the 20 s collective timeout.
    CHECK(took < std::chrono::seconds(15));
  }
  CHECK(processes_with(tag) == 0);
}

TEST_CASE("over Gloo alone a stopped rank is named within the heartbeat timeout", "[multirank][failure][heartbeat]") {
  const auto tag = unique_tag();
  const auto start = std::chrono::steady_clock::now();
  const auto out = launched_pair("sigstop", tag, /*stopped_rank_1=*/true);
  INFO(out);
  CHECK_THAT(out, Catch::Contains("status 1"));
  CHECK_THAT(out, Catch::Contains("rank 1 on ") && Catch::Contains("has shown no sign of life") &&
                      Catch::Contains("rank 0 was in allreduce(mean) of"));
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(15));  // not the 20 s timeout
  CHECK(processes_with(tag) == 0);
}

// ---- workers that are alive but make no progress ----

namespace {
// From a stuck scenario's run: when the first rank got stuck (its "STUCK rank R at T" line) and
// when the driver recorded the failure (outcome.json), in Unix seconds.
std::pair<double, double> stuck_and_failed(const std::string& output, const std::string& tag, const std::string& name) {
  const auto at = output.find("STUCK rank ");
  REQUIRE(at != std::string::npos);
  const double stuck = std::stod(output.substr(output.find(" at ", at) + 4));
  std::ifstream in(scratch(tag) / "multirank_runs" / name / "outcome.json");
  const auto outcome = nlohmann::json::parse(in);
  REQUIRE(outcome["failures"].size() == 1);
  CHECK_THAT(outcome["failures"][0]["cause"].get<std::string>(), Catch::Contains("made no progress"));
  return {stuck, outcome["failures"][0]["time"].get<double>()};
}
}  // namespace

TEST_CASE("a rank whose training thread is stuck while its heartbeat beats is named by the rank waiting for it and the group restarts", "[multirank][failure][heartbeat][progress]") {
  const auto tag = unique_tag();
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  auto r = scenario("stuck --workers 2", tag);
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK_THAT(r.output, Catch::Contains("restarts=1"));
  // Found by rank 0, which waits for it in the step's allreduce: the rank, its host, where it was.
  CHECK_THAT(r.output, Catch::Contains("rank 1 on " + std::string(host) + " (pid ") &&
                           Catch::Contains("made no progress for") &&
                           Catch::Contains("while rank 0 waits at a collective: last progress at batch #3 of an epoch") &&
                           Catch::Contains("its heartbeat goes on, so it is alive but stuck"));
  const auto [stuck, failed] = stuck_and_failed(r.output, tag, "stuck");
  CHECK(failed - stuck < 3.0 + 5.0);  // FailureConfig::progress_timeout is 3 s
  CHECK(processes_with(tag) == 0);
}

TEST_CASE("a group whose every rank is stuck is stopped by the driver and restarted", "[multirank][failure][heartbeat][progress]") {
  const auto tag = unique_tag();
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  for (const int workers : {2, 1}) {
    INFO(workers << " workers");
    auto r = scenario("stuck_all --workers " + std::to_string(workers), tag);
    INFO(r.output);
    CHECK(r.status == 0);
    CHECK_THAT(r.output, Catch::Contains("restarts=1"));
    // No rank waits for another: the driver finds them, rank 0 first.
    CHECK_THAT(r.output, Catch::Contains("training failed: rank 0 on " + std::string(host) + " (pid ") &&
                             Catch::Contains("the driver stopped the group; first error: rank 0 made no progress: "
                                             "last progress at batch #3 of an epoch (ctx.shard)"));
    if (workers == 2) CHECK_THAT(r.output, Catch::Contains("(and rank 1 on " + std::string(host) + " (pid "));
    const auto [stuck, failed] = stuck_and_failed(r.output, tag, "stuck_all");
    CHECK(failed - stuck < 3.0 + 5.0);
    fs::remove_all(scratch(tag) / "multirank_runs");
  }
  CHECK(processes_with(tag) == 0);
}

TEST_CASE("slow steps shorter than the progress timeout do not trip it", "[multirank][failure][heartbeat][progress]") {
  const auto tag = unique_tag();
  // 1.5 s steps against a 3 s timeout: rank 1 alone (rank 0 waits), then both ranks at once.
  auto r = scenario("slow_step --workers 2", tag);
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK_THAT(r.output, Catch::Contains("restarts=0"));
  CHECK_THAT(r.output, !Catch::Contains("made no progress"));
  CHECK(processes_with(tag) == 0);
}

// ---- a launched run records itself as dtrain's driver does ----

namespace {
// The files of a run directory, relative to it (a checkpoint's files under "checkpoint/").
std::vector<std::string> run_files(const fs::path& run) {
  std::vector<std::string> names;
  for (const auto& e : fs::recursive_directory_iterator(run)) {
    if (!e.is_regular_file()) continue;
    auto rel = fs::relative(e.path(), run).string();
    if (rel.rfind("checkpoint_", 0) == 0 && rel.find('/') != std::string::npos) rel = "checkpoint/" + rel.substr(rel.find('/') + 1);
    names.push_back(rel);
  }
  std::sort(names.begin(), names.end());
  return names;
}

nlohmann::json read_json_file(const fs::path& p) {
  std::ifstream in(p);
  INFO(p.string());
  REQUIRE(in.good());
  return nlohmann::json::parse(in);
}
}  // namespace

TEST_CASE("under launcher variables rank 0 writes the files the driver writes", "[multirank][launcher][tracking]") {
  const auto tag = unique_tag();
  const fs::path dir = scratch(tag);
  const std::string args = "fsdp_train --strategy ddp --checkpoint 1 --workers 2";
  auto driven = scenario(args + " --storage driven", tag);
  INFO(driven.output);
  REQUIRE(driven.status == 0);
  const auto out = launched_pair(args + " --storage launched", tag);
  INFO(out);
  REQUIRE_THAT(out, Catch::Contains("status 0 0"));
  const fs::path run = dir / "launched" / "fsdp_train_ddp";
  // The same files as the driver's run: params, outcome, history, checkpoint index, report.
  CHECK(run_files(run) == run_files(dir / "driven" / "fsdp_train_ddp"));
  for (const char* f : {"params.json", "outcome.json", "checkpoints.json", "metrics.jsonl", "metrics.csv", "report.html"})
    CHECK(fs::exists(run / f));
  const auto params = read_json_file(run / "params.json");
  CHECK(params["format"] == 1);
  CHECK(params["scaling"]["num_workers"] == 2);  // the launcher's world size
  const auto outcome = read_json_file(run / "outcome.json");
  CHECK(outcome["status"] == "finished");
  CHECK(outcome["error"].is_null());
  CHECK(outcome["reports"] == 1);
  CHECK(outcome["end_time"].get<double>() >= outcome["start_time"].get<double>());
  const auto index = read_json_file(run / "checkpoints.json");
  REQUIRE(index["checkpoints"].size() == 1);
  CHECK(index["latest"] == "checkpoint_000001");
  CHECK(index["checkpoints"][0]["step"] == 6);
  std::ifstream report(run / "report.html");
  const std::string html((std::istreambuf_iterator<char>(report)), {});
  // One report of a 6-step run: its values in the table, no one-point chart.
  CHECK_THAT(html, Catch::Contains("<table id=\"final-metrics\">") && Catch::Contains("fsdp_train_ddp") &&
                       !Catch::Contains("<svg"));

  SECTION("a launched run that fails is recorded as failed with rank 0's error") {
    const auto failed = launched_pair("mismatch --variant allgather_vs_sum --storage failing", tag);
    INFO(failed);
    CHECK_THAT(failed, Catch::Contains("status 1 1"));
    const auto o = read_json_file(dir / "failing" / "mismatch" / "outcome.json");
    CHECK(o["status"] == "failed");
    CHECK(o["error_rank"] == 0);
    CHECK_THAT(o["error"].get<std::string>(), Catch::Contains("collectives do not match"));
    CHECK(fs::exists(dir / "failing" / "mismatch" / "report.html"));
  }
  CHECK(processes_with(tag) == 0);
}
