// SPDX-License-Identifier: Apache-2.0
// Learning-rate schedules: their rates equal python3-torch's schedulers on the same steps and
// metric sequence, their state round-trips through an archive, and a run killed and resumed with
// a schedule and dynamic loss scaling ends bitwise equal to one never stopped.

#include "../dtrain_catch.hpp"
#include "../run_command.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <iterator>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <torch/torch.h>

#include <dtrain/checkpointer/checkpoint.hpp>
#include <dtrain/checkpointer/write.hpp>
#include <dtrain/schedule/plateau.hpp>
#include <dtrain/schedule/step_lr.hpp>
#include <dtrain/schedule/warmup_cosine.hpp>

namespace fs = std::filesystem;
using dtrain::schedule::PlateauOptions;

namespace {

// Runs `cmd`; its stdout and stderr together, and the exit status.
std::pair<int, std::string> run_command(const std::string& cmd) {
  auto r = dtrain_test::run_command(cmd);
  return {r.status, std::move(r.output)};
}

// Python's learning rates of both param groups after each step, one line per step, from a script
// that builds `opt` (two groups, lr 0.1 and 0.02) and `sched`, then runs `loop`.
std::vector<std::vector<double>> python_lrs(const std::string& sched, const std::string& loop) {
  const std::string script =
      "import math, warnings, torch\n"
      "warnings.simplefilter(\"ignore\")\n"
      "from torch.optim import lr_scheduler as L\n"
      "a, b = torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))\n"
      "opt = torch.optim.SGD([{\"params\": [a], \"lr\": 0.1}, {\"params\": [b], \"lr\": 0.02}], lr=0.1)\n"
      "sched = " + sched + "\n"
      "def show():\n"
      "    print(*[\"%.17g\" % g[\"lr\"] for g in opt.param_groups])\n"
      "show()\n" + loop;
  const auto [status, out] = run_command(std::string(PYTHON3) + " -c '" + script + "'");
  INFO(out);
  REQUIRE(status == 0);
  std::vector<std::vector<double>> rows;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    std::istringstream l(line);
    rows.emplace_back(std::istream_iterator<double>(l), std::istream_iterator<double>());
  }
  return rows;
}

struct TwoGroups {
  torch::Tensor a = torch::zeros({1}, torch::requires_grad()), b = torch::zeros({1}, torch::requires_grad());
  torch::optim::SGD opt{std::vector<torch::optim::OptimizerParamGroup>{
                            torch::optim::OptimizerParamGroup({a}, std::make_unique<torch::optim::SGDOptions>(0.1)),
                            torch::optim::OptimizerParamGroup({b}, std::make_unique<torch::optim::SGDOptions>(0.02))},
                        torch::optim::SGDOptions(0.1)};
  std::vector<double> lrs() const { return dtrain::schedule::detail::group_lrs(opt); }
};

void check_equal(const std::vector<std::vector<double>>& cpp, const std::vector<std::vector<double>>& py) {
  REQUIRE(cpp.size() == py.size());
  for (std::size_t t = 0; t < cpp.size(); ++t) {
    INFO("step " << t);
    REQUIRE(cpp[t].size() == py[t].size());
    for (std::size_t g = 0; g < cpp[t].size(); ++g)
      CHECK(cpp[t][g] == Approx(py[t][g]).epsilon(1e-12).margin(1e-300));
  }
}

// A metric sequence with improvements, small (sub-threshold) ones, plateaus and a NaN.
const std::vector<double> metrics = {5.0, 4.0, 4.0, 3.9999, 3.99, 4.1, 4.2, 3.0, 3.0, 3.0, 3.0, 2.9,
                                     std::numeric_limits<double>::quiet_NaN(), 2.95, 2.5, 2.5, 2.5, 2.5,
                                     2.5, 2.5, 2.6, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0};

std::string python_metrics() {
  std::string s = "[";
  for (const double m : metrics) s += (std::isnan(m) ? std::string("float(\"nan\")") : std::to_string(m)) + ",";
  return s + "]";
}

}  // namespace

TEST_CASE("StepLR sets the learning rates of python3-torch's StepLR") {
  TwoGroups g;
  dtrain::schedule::StepLR s(g.opt, 3, 0.5);
  std::vector<std::vector<double>> cpp{g.lrs()};
  for (int t = 0; t < 20; ++t) {
    s.step();
    CHECK(s.lrs() == g.lrs());
    cpp.push_back(g.lrs());
  }
  check_equal(cpp, python_lrs("L.StepLR(opt, step_size=3, gamma=0.5)",
                              "for t in range(20):\n    opt.step()\n    sched.step()\n    show()\n"));
  CHECK(cpp.back()[1] == 0.02 * std::pow(0.5, 6));
}

TEST_CASE("WarmupCosine sets the learning rates of python3-torch's LinearLR then CosineAnnealingLR") {
  for (const double min_lr : {0.0, 1e-3}) {
    INFO("min_lr " << min_lr);
    TwoGroups g;
    dtrain::schedule::WarmupCosine s(g.opt, {.warmup_steps = 5, .total_steps = 30, .start_factor = 0.01, .min_lr = min_lr});
    std::vector<std::vector<double>> cpp{g.lrs()};
    for (int t = 0; t < 30; ++t) {
      s.step();
      cpp.push_back(g.lrs());
    }
    check_equal(cpp, python_lrs("L.SequentialLR(opt, [L.LinearLR(opt, start_factor=0.01, total_iters=5), "
                                "L.CosineAnnealingLR(opt, T_max=25, eta_min=" + std::to_string(min_lr) +
                                    ")], milestones=[5])",
                                "for t in range(30):\n    opt.step()\n    sched.step()\n    show()\n"));
    // Past total_steps the rate stays at min_lr.
    s.step();
    CHECK(g.lrs() == std::vector<double>{min_lr, min_lr});
  }
  TwoGroups g;
  CHECK_THROWS_WITH((dtrain::schedule::WarmupCosine(g.opt, {.warmup_steps = 10, .total_steps = 10})),
                    Catch::Contains("warmup_steps 10 and total_steps 10"));
}

TEST_CASE("ReduceLROnPlateau sets the learning rates of python3-torch's on the same metric sequence") {
  struct Case {
    PlateauOptions options;
    std::string python;
  };
  using M = PlateauOptions::Mode;
  using T = PlateauOptions::Threshold;
  const std::vector<Case> cases = {
      {{}, "mode=\"min\""},
      {{.mode = M::min, .factor = 0.5, .patience = 1, .threshold = 0.01, .threshold_mode = T::abs, .cooldown = 2},
       "mode=\"min\", factor=0.5, patience=1, threshold=0.01, threshold_mode=\"abs\", cooldown=2"},
      {{.mode = M::max, .factor = 0.3, .patience = 2, .threshold = 0.001, .threshold_mode = T::rel, .min_lr = 0.004},
       "mode=\"max\", factor=0.3, patience=2, threshold=0.001, threshold_mode=\"rel\", min_lr=0.004"},
      {{.mode = M::max, .factor = 0.5, .patience = 0, .threshold = 0.05, .threshold_mode = T::abs, .cooldown = 1,
        .min_lr = 1e-4, .eps = 1e-3},
       "mode=\"max\", factor=0.5, patience=0, threshold=0.05, threshold_mode=\"abs\", cooldown=1, min_lr=1e-4, eps=1e-3"},
  };
  for (const auto& c : cases) {
    INFO(c.python);
    TwoGroups g;
    dtrain::schedule::ReduceLROnPlateau s(g.opt, c.options);
    std::vector<std::vector<double>> cpp{g.lrs()};
    for (const double m : metrics) {
      s.step(m);
      cpp.push_back(g.lrs());
    }
    const auto py = python_lrs("L.ReduceLROnPlateau(opt, " + c.python + ")",
                               "for m in " + python_metrics() + ":\n    opt.step()\n    sched.step(m)\n    show()\n");
    check_equal(cpp, py);
    CHECK(cpp.back() != cpp.front());  // the sequence reduces the rate in every case
  }
  TwoGroups g;
  CHECK_THROWS_WITH(dtrain::schedule::ReduceLROnPlateau(g.opt, {.factor = 1.5}), Catch::Contains("factor 1.5"));
}

namespace {
template <class Schedule>
std::string archived(const Schedule& s) {
  return dtrain::checkpointer::detail::archive_bytes(s);
}
template <class Schedule>
void load_from(Schedule& s, const std::string& bytes) {
  torch::serialize::InputArchive in;
  std::istringstream is(bytes);
  in.load_from(is);
  s.load(in);
}
}  // namespace

TEST_CASE("a schedule's state round-trips through an archive and sets the optimizer's rates") {
  static_assert(dtrain::schedule::LrSchedule<dtrain::schedule::StepLR>);
  static_assert(dtrain::schedule::LrSchedule<dtrain::schedule::WarmupCosine>);
  static_assert(dtrain::schedule::LrSchedule<dtrain::schedule::ReduceLROnPlateau>);
  static_assert(dtrain::checkpointer::SavableState<dtrain::schedule::ReduceLROnPlateau>);

  // Each schedule is stepped, saved, loaded into a new one over a new optimizer (built as at a
  // resume: the constructor's rates), and both go on with bitwise equal rates.
  auto check = [](auto make, auto advance) {
    TwoGroups ga, gb;
    auto a = make(ga.opt);
    for (int t = 0; t < 7; ++t) advance(a, t);
    // The optimizer restored before the schedule is built (ctx.restore first) holds decayed rates;
    // the schedule's base rates come from the archive, not from them.
    gb.opt.param_groups()[0].options().set_lr(ga.lrs()[0]);
    auto b = make(gb.opt);
    load_from(b, archived(a));
    CHECK(b.steps() == a.steps());
    CHECK(b.lrs() == a.lrs());
    CHECK(gb.lrs() == ga.lrs());
    for (int t = 7; t < 20; ++t) {
      advance(a, t), advance(b, t);
      CHECK(gb.lrs() == ga.lrs());
    }
  };
  auto step = [](auto& s, int) { s.step(); };
  check([](auto& opt) { return dtrain::schedule::StepLR(opt, 2, 0.7); }, step);
  check([](auto& opt) { return dtrain::schedule::WarmupCosine(opt, {.warmup_steps = 4, .total_steps = 18}); }, step);
  check([](auto& opt) { return dtrain::schedule::ReduceLROnPlateau(opt, {.patience = 1, .cooldown = 1}); },
        [](auto& s, int t) { s.step(metrics[static_cast<std::size_t>(t)]); });

  // Another kind of schedule, or another number of param groups, is refused by name.
  TwoGroups g;
  dtrain::schedule::StepLR step_lr(g.opt, 2);
  dtrain::schedule::ReduceLROnPlateau plateau(g.opt);
  CHECK_THROWS_WITH(load_from(plateau, archived(step_lr)),
                    Catch::Contains("ReduceLROnPlateau cannot load the state of a StepLR"));
  auto p = torch::zeros({1}, torch::requires_grad());
  torch::optim::SGD one({p}, torch::optim::SGDOptions(0.1));
  dtrain::schedule::StepLR single(one, 2);
  CHECK_THROWS_WITH(load_from(single, archived(step_lr)), Catch::Contains("drove 2 param groups") &&
                                                              Catch::Contains("this optimizer has 1"));
}

namespace {
struct ScheduleBox {
  fs::path dir;
  ScheduleBox() {
    std::random_device rd;
    dir = fs::temp_directory_path() / ("dtrain_schedule_" + std::to_string(rd()) + std::to_string(getpid()));
    fs::create_directories(dir);
  }
  std::pair<int, std::string> scenario(const std::string& args) const {
    return run_command("cd '" + dir.string() + "' && '" + SCENARIOS_BIN + "' --storage '" + (dir / "runs").string() +
                       "' " + args);
  }
  std::string file(const std::string& n) const { return (dir / n).string(); }
};

std::string value_of(const std::string& out, const std::string& key) {
  const auto at = out.find(key + "=");
  REQUIRE(at != std::string::npos);
  const auto begin = at + key.size() + 1;
  return out.substr(begin, out.find_first_of(" \n", begin) - begin);
}

bool same_tensors(const std::string& a, const std::string& b) {
  std::vector<torch::Tensor> x, y;
  torch::load(x, a);
  torch::load(y, b);
  if (x.size() != y.size() || x.empty()) return false;
  for (std::size_t i = 0; i < x.size(); ++i)
    if (!torch::equal(x[i], y[i])) return false;
  return true;
}
}  // namespace

TEST_CASE("a run with a schedule and dynamic loss scaling killed and resumed ends bitwise equal to one never stopped") {
  for (const std::string schedule : {"cosine", "plateau"}) {
    INFO(schedule);
    ScheduleBox box;
    const auto common = "--steps 40 --every 5 --amp 1 --schedule " + schedule;
    const auto [ref_status, ref] = box.scenario("--name ref " + common + " --out ref.pt");
    INFO(ref);
    REQUIRE(ref_status == 0);
    const auto [status, out] = box.scenario("--name kill " + common + " --kill-step 17 --max-failures 1 --out kill.pt");
    INFO(out);
    REQUIRE(status == 0);
    CHECK(value_of(out, "restarts") == "1");
    CHECK_THAT(out, Catch::Contains("RESUMED "));
    CHECK(value_of(out, "FINAL lr") == value_of(ref, "FINAL lr"));
    CHECK(value_of(out, "loss_scale") == value_of(ref, "loss_scale"));
    CHECK(value_of(ref, "loss_scale") != "1024");  // the scaler's state changed during the run
    CHECK(std::stod(value_of(ref, "FINAL lr")) < 0.05);  // the schedule changed the rate
    CHECK(same_tensors(box.file("ref.pt"), box.file("kill.pt")));
    // Every checkpoint holds the schedule beside the scaler's state.
    const auto ck = dtrain::checkpointer::Checkpoint::open(box.dir / "runs" / "kill" / "checkpoint_000008");
    REQUIRE(ck);
    CHECK(ck->has_object(dtrain::schedule::checkpoint_name));
    CHECK(fs::exists(ck->path() / "precision.pt"));
    fs::remove_all(box.dir);
  }
}
