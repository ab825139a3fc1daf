// Multi-process tests: the scenarios program is a real driver with real workers over Gloo on
// loopback; these tests run it and check its output, exit status, files and leftover processes.

#include "../dtrain_catch.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <torch/torch.h>

namespace fs = std::filesystem;

namespace {

struct Run {
  int status = -1;
  std::string output;
};

std::string unique_tag() {
  std::random_device rd;
  return "t" + std::to_string(rd()) + std::to_string(getpid());
}

// Runs the scenarios program in a fresh directory with `env` prefixed; returns exit status and
// everything it printed. Every run carries a unique --tag so leftover processes can be found.
Run scenario(const std::string& args, const std::string& tag, const std::string& env = "") {
  const fs::path dir = fs::temp_directory_path() / ("dtrain_multirank_" + tag);
  fs::create_directories(dir);
  const std::string cmd = "cd '" + dir.string() + "' && " + env + " '" + SCENARIOS_BIN + "' " + args +
                          " --tag " + tag + " 2>&1";
  Run r;
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p)) r.output += buf;
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return r;
}

// Processes whose command line carries `tag`.
int processes_with(const std::string& tag) {
  int n = 0;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const auto name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(e.path() / "cmdline", std::ios::binary);
    std::string cmdline((std::istreambuf_iterator<char>(in)), {});
    // A zombie has an empty cmdline; count it through its status instead.
    std::ifstream status(e.path() / "stat");
    std::string stat((std::istreambuf_iterator<char>(status)), {});
    if (cmdline.find(tag) != std::string::npos) ++n;
    else if (cmdline.empty() && stat.find("scenarios") != std::string::npos && stat.find(") Z") != std::string::npos) ++n;
  }
  return n;
}

double metric(const std::string& out, const std::string& key) {
  const auto at = out.find(" " + key + "=");
  REQUIRE(at != std::string::npos);
  return std::stod(out.substr(at + key.size() + 2));
}

std::vector<torch::Tensor> load_params(const fs::path& p) {
  std::vector<torch::Tensor> v;
  torch::load(v, p.string());
  return v;
}

}  // namespace

TEST_CASE("2 workers give the parameters of 1 worker on the same samples", "[multirank][ddp]") {
  const auto tag = unique_tag();
  const fs::path one = fs::temp_directory_path() / (tag + "_1.pt"), two = fs::temp_directory_path() / (tag + "_2.pt");
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

TEST_CASE("workers started as fresh processes (threads_per_worker > 1) train the same", "[multirank][exec]") {
  const auto tag = unique_tag();
  const fs::path one = fs::temp_directory_path() / (tag + "_1.pt"), two = fs::temp_directory_path() / (tag + "_2.pt");
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

TEST_CASE("report and all_reduce are synchronised steps; rank 0's metrics are recorded", "[multirank][report]") {
  const auto tag = unique_tag();
  auto r = scenario("report --workers 2 --steps 2 --storage " + (fs::temp_directory_path() / tag).string(), tag);
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK(metric(r.output, "sum") == 3);
  CHECK(metric(r.output, "mean") == 1.5);
  CHECK(metric(r.output, "max") == 2);
  CHECK(metric(r.output, "rank") == 0);
  CHECK(metric(r.output, "world") == 2);
  CHECK(metric(r.output, "rows") == 1);
  const auto run_dir = fs::temp_directory_path() / tag / "report";
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

TEST_CASE("a worker that throws stops the run with its rank and message; nothing is left", "[multirank][failure]") {
  const auto tag = unique_tag();
  auto r = scenario("throw --workers 2", tag);
  INFO(r.output);
  CHECK(r.status == 3);
  CHECK_THAT(r.output, Catch::Contains("rank 1") && Catch::Contains("boom at step 3"));
  CHECK(processes_with(tag) == 0);
}

TEST_CASE("a worker killed by SIGKILL stops the run naming rank and signal; nothing is left", "[multirank][failure]") {
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
  CHECK(processes_with(tag) == 0);
}

TEST_CASE("a rendezvous that never completes names the missing ranks", "[multirank][rendezvous]") {
  // Rank 0 of 3 under an external launcher's variables: ranks 1 and 2 never come.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const std::string port = std::to_string(ntohs(addr.sin_port));
  close(fd);  // free again: rank 0 hosts the store there
  const auto tag = unique_tag();
  auto r = scenario("equivalence --rendezvous-ms 1500", tag, "RANK=0 WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + port);
  INFO(r.output);
  CHECK(r.status == 1);
  CHECK_THAT(r.output, Catch::Contains("rank(s) 1, 2 of world size 3 never arrived"));
}

TEST_CASE("killing the driver takes its workers with it", "[multirank][failure]") {
  const auto tag = unique_tag();
  const fs::path dir = fs::temp_directory_path() / ("dtrain_multirank_" + tag);
  fs::create_directories(dir);
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
    outs.push_back(fs::temp_directory_path() / (tag + "_eval" + std::to_string(workers) + ".pt"));
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
