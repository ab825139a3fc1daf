// SPDX-License-Identifier: Apache-2.0
// Checkpoint tests: the checkpoint scenarios program is a real driver with real workers over Gloo
// on loopback and checkpointer::directory<>. These tests run it, kill its workers (SIGKILL, a crash
// inside a checkpoint write), damage its files, and check what it resumes from and ends with.

#include "../dtrain_catch.hpp"
#include "../run_command.hpp"
#include "sandbox.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <functional>
#include <iterator>
#include <memory>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/torch.h>

#include <sys/resource.h>

#include <csignal>

#include <dtrain/checkpointer/checkpoint.hpp>
#include <dtrain/checkpointer/write.hpp>
#include <dtrain/detail/torch_compat.hpp>
#include <dtrain/precision/amp.hpp>
#include <dtrain/run_directory.hpp>
#include <dtrain/tracking/record.hpp>

namespace fs = std::filesystem;

namespace {

using dtrain_test::field;
using dtrain_test::load_params;
using dtrain_test::reseal;
using dtrain_test::Run;
using dtrain_test::same_params;
using dtrain_test::Sandbox;

std::set<std::string> checkpoint_dirs(const fs::path& run) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(run))
    if (e.is_directory()) names.insert(e.path().filename().string());
  return names;
}

std::string hex_of(const torch::Tensor& t) {
  const auto c = t.contiguous();
  const auto* p = static_cast<const unsigned char*>(c.data_ptr());
  std::ostringstream os;
  for (std::int64_t i = 0; i < c.numel() * static_cast<std::int64_t>(c.element_size()); ++i)
    os << "0123456789abcdef"[p[i] >> 4] << "0123456789abcdef"[p[i] & 15];
  return os.str();
}

// Runs `script` with /usr/bin/python3 (Debian's torch 1.13), or `interpreter`, and `args`; stdout
// and stderr together.
Run python(const std::string& script, const std::vector<std::string>& args, const std::string& interpreter = PYTHON3) {
  std::string cmd = interpreter + " -c '" + script + "'";
  for (const auto& a : args) cmd += " '" + a + "'";
  return dtrain_test::run_command(cmd);
}

// Python: load_state(path) is torch.load(path, weights_only=True), except that on torch < 2.0,
// whose restricted unpickler lacks the float opcode (BINFLOAT: an optimizer's lr), it checks every
// opcode and global of the pickle against what that unpickler allows, floats aside, and loads it.
const std::string python_load_state =
    "import pickletools, zipfile, torch\n"
    "OPS = set(\"PROTO STOP GLOBAL NEWOBJ REDUCE BUILD APPEND APPENDS SETITEM SETITEMS MARK TUPLE TUPLE1 TUPLE2 "
    "TUPLE3 NONE NEWFALSE NEWTRUE EMPTY_TUPLE EMPTY_LIST EMPTY_DICT EMPTY_SET BININT BININT1 BININT2 BINUNICODE "
    "SHORT_BINSTRING BINPERSID BINGET LONG_BINGET BINPUT LONG_BINPUT LONG1 BINFLOAT\".split())\n"
    "def load_state(path):\n"
    "    if tuple(int(x) for x in torch.__version__.split(\".\")[:2]) >= (2, 0):\n"
    "        return torch.load(path, weights_only=True)\n"
    "    z = zipfile.ZipFile(path)\n"
    "    data = z.read([n for n in z.namelist() if n.endswith(\"/data.pkl\")][0])\n"
    "    allowed = torch._weights_only_unpickler._get_allowed_globals()\n"
    "    for op, arg, _ in pickletools.genops(data):\n"
    "        assert op.name in OPS, op.name\n"
    "        assert op.name != \"GLOBAL\" or arg.replace(\" \", \".\") in allowed, arg\n"
    "    return torch.load(path, weights_only=False)\n";

// The uninterrupted reference run: 40 steps (over an epoch boundary), a checkpoint every 5.
Run reference(const Sandbox& box) {
  auto r = box.scenario("--name ref --steps 40 --every 5 --out ref.pt --python-optimizer 1");
  INFO(r.output);
  REQUIRE(r.status == 0);
  REQUIRE(field(r.output, "restarts") == "0");
  return r;
}

}  // namespace

TEST_CASE("a worker killed by SIGKILL mid-epoch is restarted and ends bitwise equal to an uninterrupted run", "[compat]") {
  Sandbox box;
  const auto ref = reference(box);
  // Step 23: after checkpoint 4 (step 20), not on a checkpoint step; step 37: in the second epoch.
  for (int kill : {23, 37}) {
    const std::string name = "kill" + std::to_string(kill);
    auto r = box.scenario("--name " + name + " --steps 40 --every 5 --kill-step " + std::to_string(kill) +
                          " --max-failures 1 --out " + name + ".pt");
    INFO(r.output);
    REQUIRE(r.status == 0);
    CHECK(field(r.output, "restarts") == "1");
    CHECK_THAT(r.output, Catch::Contains("rank 1 was killed by signal 9"));
    CHECK_THAT(r.output, Catch::Contains("RESUMED"));
    CHECK(same_params(box.file("ref.pt"), box.file(name + ".pt")));
    // The metrics history continues: 8 reports, as without the kill, and the same last loss.
    CHECK(field(r.output, "rows") == "8");
    CHECK(field(r.output, "loss") == field(ref.output, "loss"));
  }
}

TEST_CASE("without restarts left, fit() throws WorkerError naming each failure") {
  Sandbox box;
  auto r = box.scenario("--name fail --steps 40 --every 5 --kill-step 23 --kill-always 1 --max-failures 1");
  INFO(r.output);
  CHECK(r.status == 3);
  CHECK_THAT(r.output, Catch::Contains("training failed 2 times") && Catch::Contains("attempt 0: ") &&
                           Catch::Contains("attempt 1: ") && Catch::Contains("rank 1 was killed by signal 9") &&
                           Catch::Contains("max_failures = 1"));
}

TEST_CASE("a crash inside a checkpoint write leaves the previous checkpoint valid, and the run resumes from it") {
  Sandbox box;
  reference(box);
  // Rank 0 _exits halfway through model.pt of checkpoint 3, before the rename.
  auto r = box.scenario("--name crash --steps 40 --every 5 --fault-iteration 3 --max-failures 1 --out crash.pt");
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK(field(r.output, "restarts") == "1");
  CHECK_THAT(r.output, Catch::Contains("rank 0 exited with status 9"));
  CHECK_THAT(r.output, Catch::Contains("RESUMED " + box.run("crash").string() + "/checkpoint_000002 steps=10"));
  CHECK(same_params(box.file("ref.pt"), box.file("crash.pt")));
  // The half-written temporary directory is gone; checkpoint 3 was written again, whole.
  for (const auto& name : checkpoint_dirs(box.run("crash"))) CHECK(name.rfind(".tmp", 0) != 0);
  CHECK(dtrain::checkpointer::Checkpoint::verify(box.run("crash") / "checkpoint_000003").empty());
}

TEST_CASE("truncated, bit-flipped and unfinished checkpoints are detected, reported and fallen back from") {
  Sandbox box;
  reference(box);
  // A run stopped after 20 steps (checkpoints 1-4), damaged, then continued to 40 steps.
  auto first = box.scenario("--name hurt --steps 20 --every 5");
  INFO(first.output);
  REQUIRE(first.status == 0);
  const auto run = box.run("hurt");
  const auto c4 = run / "checkpoint_000004", c3 = run / "checkpoint_000003";
  fs::resize_file(c4 / "model.pt", fs::file_size(c4 / "model.pt") / 2);  // truncated
  {
    std::fstream f(c3 / "optimizer.pt", std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(100);
    char byte = 0;
    f.read(&byte, 1);
    byte ^= 0x10;  // one bit flipped
    f.seekp(100);
    f.write(&byte, 1);
  }
  CHECK_THAT(dtrain::checkpointer::Checkpoint::verify(c4), Catch::Contains("model.pt") && Catch::Contains("truncated"));
  CHECK_THAT(dtrain::checkpointer::Checkpoint::verify(c3), Catch::Contains("optimizer.pt") && Catch::Contains("CRC-32"));
  // A half-written checkpoint from a crash: a temporary directory without a manifest.
  fs::create_directories(run / ".tmp_checkpoint_000005");
  std::ofstream(run / ".tmp_checkpoint_000005" / "model.pt") << "half";

  auto r = box.scenario("--name hurt --steps 40 --every 5 --out hurt.pt");
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK_THAT(r.output, Catch::Contains("checkpoint " + c4.string() + " is damaged"));
  CHECK_THAT(r.output, Catch::Contains("checkpoint " + c3.string() + " is damaged"));
  CHECK_THAT(r.output, Catch::Contains("RESUMED " + (run / "checkpoint_000002").string() + " steps=10"));
  CHECK(same_params(box.file("ref.pt"), box.file("hurt.pt")));
  CHECK_FALSE(fs::exists(run / ".tmp_checkpoint_000005"));
  CHECK(field(r.output, "rows") == "8");
  // The damaged ones were written again, whole.
  CHECK(dtrain::checkpointer::Checkpoint::verify(c4).empty());
  CHECK(dtrain::checkpointer::Checkpoint::verify(c3).empty());

  SECTION("a checkpoint without its manifest is not valid either") {
    fs::remove(run / "checkpoint_000008" / "manifest.json");
    CHECK_THAT(dtrain::checkpointer::Checkpoint::verify(run / "checkpoint_000008"), Catch::Contains("no manifest"));
    auto again = box.scenario("--name hurt --steps 40 --every 5");
    INFO(again.output);
    CHECK_THAT(again.output, Catch::Contains("checkpoint " + (run / "checkpoint_000008").string() + " is damaged"));
    CHECK_THAT(again.output, Catch::Contains("RESUMED " + (run / "checkpoint_000007").string()));
  }
}

TEST_CASE("resume_from: an explicit checkpoint is resumed from, and a damaged one with nothing else valid is a clear error") {
  Sandbox box;
  reference(box);
  auto r = box.scenario("--name other --steps 40 --every 5 --resume-from " +
                        (box.run("ref") / "checkpoint_000004").string() + " --out other.pt");
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK_THAT(r.output, Catch::Contains("RESUMED " + (box.run("ref") / "checkpoint_000004").string() + " steps=20"));
  CHECK(same_params(box.file("ref.pt"), box.file("other.pt")));

  const auto bad = box.run("ref") / "checkpoint_000005";
  fs::resize_file(bad / "state.json", 3);
  auto e = box.scenario("--name fresh --steps 40 --every 5 --resume-from " + bad.string());
  INFO(e.output);
  CHECK(e.status == 3);
  CHECK_THAT(e.output, Catch::Contains("resume_from " + bad.string() + " cannot be resumed from") &&
                           Catch::Contains("state.json"));
}

TEST_CASE("retention keeps num_to_keep by score, plus the latest and the best") {
  Sandbox box;
  // Scores by iteration 1..8: 2 4 6 8 10 1 3 5. Keep 2 by max score: 5 (10) and 4 (8); plus 8 (latest).
  auto r = box.scenario("--name keep --steps 40 --every 5 --keep 2 --score score --order max");
  INFO(r.output);
  REQUIRE(r.status == 0);
  const auto run = box.run("keep");
  CHECK(checkpoint_dirs(run) == std::set<std::string>{"checkpoint_000004", "checkpoint_000005", "checkpoint_000008"});
  // The optimizer's state once by default (optimizer.pt); Python's copy only when asked for.
  CHECK(fs::is_regular_file(run / "checkpoint_000008" / "optimizer.pt"));
  CHECK_FALSE(fs::exists(run / "checkpoint_000008" / "optimizer_state.pt"));
  CHECK(field(r.output, "best") == (run / "checkpoint_000005").string());
  CHECK(field(r.output, "latest") == (run / "checkpoint_000008").string());

  // By min score, keeping 1: 6 (score 1) is best; 8 is the latest.
  auto m = box.scenario("--name keepmin --steps 40 --every 5 --keep 1 --score score --order min");
  INFO(m.output);
  REQUIRE(m.status == 0);
  CHECK(checkpoint_dirs(box.run("keepmin")) == std::set<std::string>{"checkpoint_000006", "checkpoint_000008"});
  CHECK(field(m.output, "best") == (box.run("keepmin") / "checkpoint_000006").string());

  // By recency, keeping 3.
  auto n = box.scenario("--name recent --steps 40 --every 5 --keep 3");
  REQUIRE(n.status == 0);
  CHECK(checkpoint_dirs(box.run("recent")) ==
        std::set<std::string>{"checkpoint_000006", "checkpoint_000007", "checkpoint_000008"});
}

TEST_CASE("a checkpoint's model state loads in Python's torch.load with equal tensors", "[compat]") {
  Sandbox box;
  reference(box);
  auto latest = dtrain::checkpointer::Checkpoint::open(box.run("ref") / "checkpoint_000008");
  REQUIRE(latest);
  CHECK(latest->iteration() == 8);
  CHECK(latest->steps() == 40);
  CHECK(latest->extras().at("extra_steps").number() == 40);
  CHECK(latest->metrics().at("score").number() == 5);
  // C++: the pickle read back equals the parameters the run saved with torch::save.
  const auto state = latest->model_state();
  const auto params = load_params(box.file("ref.pt"));
  const std::vector<std::string> names{"0.weight", "0.bias", "3.weight", "3.bias", "5.weight", "5.bias"};
  REQUIRE(state.size() == names.size());
  for (std::size_t i = 0; i < names.size(); ++i) CHECK(torch::equal(state.at(names[i]), params[i]));
  // load_model into a fresh module of the same shape.
  using namespace torch::nn;
  auto fresh = Sequential(Linear(20, 32), Tanh(), Dropout(0.2), Linear(32, 32), Tanh(), Linear(32, 10));
  latest->load_model(fresh);
  CHECK(torch::equal(fresh->named_parameters()["5.weight"], params[4]));

  // Python: torch.load(weights_only=True) gives a dict of tensors, which load_state_dict(strict=True)
  // takes into the same architecture; the module's state is printed as name, dtype, shape, bytes.
  // The optimizer's state dict loads into torch.optim.SGD (built with another lr, which it restores).
  const std::string script = python_load_state +
      "import sys, torch\n"
      "from torch import nn\n"
      "d = torch.load(sys.argv[1], weights_only=True)\n"
      "assert type(d) is dict, type(d)\n"
      "m = nn.Sequential(nn.Linear(20, 32), nn.Tanh(), nn.Dropout(0.2), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 10))\n"
      "m.load_state_dict(d, strict=True)\n"
      "sd = m.state_dict()\n"
      "for k in sorted(sd):\n"
      "    t = sd[k].contiguous()\n"
      "    print(k, str(t.dtype), list(t.shape), t.numpy().tobytes().hex())\n"
      "opt = torch.optim.SGD(m.parameters(), lr=1.0, momentum=0.9)\n"
      "opt.load_state_dict(load_state(sys.argv[2]))\n"
      "print(\"lr\", opt.param_groups[0][\"lr\"], \"momentum\", opt.param_groups[0][\"momentum\"])\n"
      "for i, p in enumerate(m.parameters()):\n"
      "    print(\"momentum\", i, opt.state[p][\"momentum_buffer\"].contiguous().numpy().tobytes().hex())\n";
  const auto py = python(script, {(latest->path() / "model.pt").string(), (latest->path() / "optimizer_state.pt").string()});
  INFO(py.output.substr(0, 2000));
  REQUIRE(py.status == 0);
  std::string expected;
  for (const auto& [k, t] : state) {  // std::map: sorted as Python sorts them
    std::string shape = "[";
    for (std::int64_t i = 0; i < t.dim(); ++i) shape += (i ? ", " : "") + std::to_string(t.size(i));
    expected += k + " torch.float32 " + shape + "] " + hex_of(t) + "\n";
  }
  // C++'s own optimizer.pt, loaded into an SGD over the same parameters, holds the same buffers.
  torch::optim::SGD sgd(fresh->parameters(), torch::optim::SGDOptions(1.0).momentum(0.9));
  latest->load_optimizer(sgd);
  expected += "lr 0.05 momentum 0.9\n";
  std::int64_t i = 0;
  for (const auto& p : fresh->parameters()) {
    const auto& s = static_cast<const torch::optim::SGDParamState&>(*sgd.state().at(dtrain::compat::optimizer_state_key(p)));
    expected += "momentum " + std::to_string(i++) + " " + hex_of(s.momentum_buffer()) + "\n";
  }
  CHECK(py.output == expected);

  // A model.pt written before this format (torch::jit::pickle_save, type-tagged) still loads in C++.
  const auto tagged = torch::jit::pickle_save(c10::IValue(dtrain::checkpointer::detail::named_state(*fresh, true)));
  std::ofstream(latest->path() / "model.pt", std::ios::binary | std::ios::trunc).write(tagged.data(), tagged.size());
  const auto old_state = latest->model_state();
  REQUIRE(old_state.size() == names.size());
  for (std::size_t i = 0; i < names.size(); ++i) CHECK(torch::equal(old_state.at(names[i]), params[i]));
}

namespace {
// Parameters of `m` as "P v v v ..." lines, full precision, as the Python side prints them.
std::vector<double> flat_values(const std::vector<torch::Tensor>& tensors) {
  std::vector<double> v;
  for (const auto& t : tensors) {
    const auto c = t.detach().to(torch::kDouble).contiguous().flatten();
    for (std::int64_t i = 0; i < c.numel(); ++i) v.push_back(c[i].item<double>());
  }
  return v;
}

// Fixed gradients that change from step to step, so the optimizer's state matters.
void set_grads(torch::nn::Linear& m, int k) {
  for (auto& p : m->parameters())
    p.mutable_grad() = torch::linspace(-1.0, 1.0 + k, p.numel()).reshape(p.sizes()) * (k + 1) * 0.1;
}
}  // namespace

TEST_CASE("optimizer_state.pt of SGD, Adam, AdamW, RMSprop and Adagrad continues in Python's optimizer, torch 1.13 and 2.x") {
  Sandbox box;
  using namespace torch::optim;
  struct Case {
    std::string python;  // the Python optimizer, built with other options that loading replaces
    std::function<std::unique_ptr<Optimizer>(std::vector<torch::Tensor>)> make;
  };
  const std::vector<Case> cases = {
      {"torch.optim.SGD(p, lr=1.0, momentum=0.1)",
       [](auto p) { return std::make_unique<SGD>(p, SGDOptions(0.1).momentum(0.9).weight_decay(0.01)); }},
      {"torch.optim.Adam(p, lr=1.0)", [](auto p) { return std::make_unique<Adam>(p, AdamOptions(0.01).amsgrad(true)); }},
      {"torch.optim.AdamW(p, lr=1.0)", [](auto p) { return std::make_unique<AdamW>(p, AdamWOptions(0.01).weight_decay(0.1)); }},
      {"torch.optim.RMSprop(p, lr=1.0)",
       [](auto p) { return std::make_unique<RMSprop>(p, RMSpropOptions(0.01).momentum(0.5).centered(true)); }},
      {"torch.optim.Adagrad(p, lr=1.0)", [](auto p) { return std::make_unique<Adagrad>(p, AdagradOptions(0.1)); }},
  };
  for (const auto& c : cases) {
    INFO(c.python);
    torch::manual_seed(3);
    torch::nn::Linear m(3, 2);
    auto opt = c.make(m->parameters());
    for (int k = 0; k < 2; ++k) {
      set_grads(m, k);
      opt->step();
    }
    const auto dict = dtrain::checkpointer::detail::python_optimizer_state(*opt);
    REQUIRE(dict);
    std::ofstream(box.file("opt.pt"), std::ios::binary) << dtrain::checkpointer::detail::torch_save_bytes(*dict);
    std::ofstream(box.file("model.pt"), std::ios::binary)
        << dtrain::checkpointer::detail::torch_save_bytes(
               c10::IValue(dtrain::checkpointer::detail::named_state(*m, true)));
    set_grads(m, 2);
    opt->step();  // the third step, which Python takes from the saved state
    const auto want = flat_values(m->parameters());

    const std::string step =
        "p = list(m.parameters())\n"
        "opt = " + c.python + "\n"
        "opt.load_state_dict(load_state(sys.argv[2]))\n"
        "for q in p:\n"
        "    q.grad = torch.linspace(-1.0, 3.0, q.numel()).reshape(q.shape) * 3 * 0.1\n"
        "opt.step()\n"
        "print(*[repr(v) for q in p for v in q.detach().double().flatten().tolist()])\n";
    // Debian's torch 1.13 through its restricted unpickler; a current torch (the project's venv,
    // scripts/python-env) with plain torch.load, whose default is weights_only=True since 2.6.
    const std::string debian = python_load_state + "import sys, torch\nm = torch.nn.Linear(3, 2)\n"
                               "m.load_state_dict(torch.load(sys.argv[1], weights_only=True), strict=True)\n" + step;
    const std::string current = "import sys, torch\n"
                                "assert tuple(int(x) for x in torch.__version__.split(\".\")[:2]) >= (2, 6), torch.__version__\n"
                                "load_state = torch.load\nm = torch.nn.Linear(3, 2)\n"
                                "m.load_state_dict(torch.load(sys.argv[1]), strict=True)\n" + step;
    for (const auto& [script, interpreter] : {std::pair{debian, std::string(PYTHON3)}, std::pair{current, std::string(VENV_PYTHON)}}) {
      const auto py = python(script, {box.file("model.pt").string(), box.file("opt.pt").string()}, interpreter);
      INFO(interpreter << ": " << py.output);
      REQUIRE(py.status == 0);
      std::istringstream in(py.output);
      std::vector<double> got{std::istream_iterator<double>(in), {}};
      REQUIRE(got.size() == want.size());
      for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i] == Approx(want[i]).epsilon(1e-6).margin(1e-7));
    }
  }
}

namespace {
// A one-rank checkpoint written by the library's own writer (write_rank_file, commit) holding
// `opt`'s state, as ctx.checkpoint() saves it under ddp<>; returns its directory.
fs::path write_optimizer_checkpoint(const fs::path& run, torch::optim::Optimizer& opt, const torch::nn::Module& m) {
  namespace ck = dtrain::checkpointer;
  ck::Snapshot s;
  s.has_model = true;
  s.model = ck::detail::named_state(m, true);
  s.optimizer = ck::detail::optimizer_bytes(opt);
  s.python_optimizer = ck::detail::python_optimizer_state(opt);
  s.generator = ck::detail::default_generator_state();
  const auto tmp = dtrain::RunDirectory(run).temporary_checkpoint(1);
  fs::create_directories(tmp);
  ck::detail::write_rank_file(tmp, 0, s);
  return ck::detail::commit(run, 1, 1, s, {}, [] { return true; });
}
}  // namespace

TEST_CASE("a param group's options come back with the optimizer state for SGD Adam AdamW RMSprop and Adagrad") {
  Sandbox box;
  using namespace torch::optim;
  // Each optimizer is saved with options other than its constructor's (a decayed lr, as after a
  // StepLR), and loaded into one built with the constructor's.
  struct Case {
    std::string name;
    std::function<std::unique_ptr<Optimizer>(std::vector<torch::Tensor>)> make;
    std::function<void(OptimizerOptions&)> change;
    std::function<std::string(const OptimizerOptions&)> show;  // C++ options, as Python prints them
  };
  auto num = [](double v) {
    std::ostringstream os;
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.17g", v);
    os << buf;
    return os.str();
  };
  auto flag = [](bool b) { return std::string(b ? "True" : "False"); };
  const std::vector<Case> cases = {
      {"SGD", [](auto p) { return std::make_unique<SGD>(p, SGDOptions(0.1).momentum(0.9)); },
       [](auto& o) { static_cast<SGDOptions&>(o).lr(0.001).momentum(0.5).dampening(0.1).weight_decay(0.02).nesterov(false); },
       [&](const auto& o) {
         const auto& s = static_cast<const SGDOptions&>(o);
         return "lr " + num(s.lr()) + " momentum " + num(s.momentum()) + " dampening " + num(s.dampening()) +
                " weight_decay " + num(s.weight_decay()) + " nesterov " + flag(s.nesterov());
       }},
      // amsgrad, momentum and centered are turned off, not on: LibTorch cannot step with them from a
      // state saved without their buffers.
      {"Adam", [](auto p) { return std::make_unique<Adam>(p, AdamOptions(0.01).amsgrad(true)); },
       [](auto& o) { static_cast<AdamOptions&>(o).lr(0.00025).betas({0.8, 0.95}).eps(1e-6).weight_decay(0.03).amsgrad(false); },
       [&](const auto& o) {
         const auto& s = static_cast<const AdamOptions&>(o);
         return "lr " + num(s.lr()) + " betas " + num(std::get<0>(s.betas())) + " " + num(std::get<1>(s.betas())) +
                " eps " + num(s.eps()) + " weight_decay " + num(s.weight_decay()) + " amsgrad " + flag(s.amsgrad());
       }},
      {"AdamW", [](auto p) { return std::make_unique<AdamW>(p, AdamWOptions(0.01).amsgrad(true)); },
       [](auto& o) { static_cast<AdamWOptions&>(o).lr(0.0005).betas({0.7, 0.9}).eps(1e-7).weight_decay(0.2).amsgrad(false); },
       [&](const auto& o) {
         const auto& s = static_cast<const AdamWOptions&>(o);
         return "lr " + num(s.lr()) + " betas " + num(std::get<0>(s.betas())) + " " + num(std::get<1>(s.betas())) +
                " eps " + num(s.eps()) + " weight_decay " + num(s.weight_decay()) + " amsgrad " + flag(s.amsgrad());
       }},
      {"RMSprop", [](auto p) { return std::make_unique<RMSprop>(p, RMSpropOptions(0.01).momentum(0.3).centered(true)); },
       [](auto& o) { static_cast<RMSpropOptions&>(o).lr(0.002).alpha(0.9).eps(1e-5).weight_decay(0.01).momentum(0.1).centered(false); },
       [&](const auto& o) {
         const auto& s = static_cast<const RMSpropOptions&>(o);
         return "lr " + num(s.lr()) + " alpha " + num(s.alpha()) + " eps " + num(s.eps()) + " weight_decay " +
                num(s.weight_decay()) + " momentum " + num(s.momentum()) + " centered " + flag(s.centered());
       }},
      {"Adagrad", [](auto p) { return std::make_unique<Adagrad>(p, AdagradOptions(0.1)); },
       [](auto& o) { static_cast<AdagradOptions&>(o).lr(0.004).lr_decay(0.01).weight_decay(0.05).eps(1e-9); },
       [&](const auto& o) {
         const auto& s = static_cast<const AdagradOptions&>(o);
         return "lr " + num(s.lr()) + " lr_decay " + num(s.lr_decay()) + " weight_decay " + num(s.weight_decay()) +
                " initial_accumulator_value " + num(s.initial_accumulator_value()) + " eps " + num(s.eps());
       }},
  };
  for (const auto& c : cases) {
    INFO(c.name);
    torch::manual_seed(3);
    torch::nn::Linear m(3, 2);
    auto opt = c.make(m->parameters());
    set_grads(m, 0);
    opt->step();
    c.change(opt->param_groups()[0].options());
    const auto saved = c.show(opt->param_groups()[0].options());
    const auto dir = write_optimizer_checkpoint(box.run(c.name), *opt, *m);
    auto ck = dtrain::checkpointer::Checkpoint::open(dir);
    REQUIRE(ck);

    // LibTorch 1.13's own Optimizer::load keeps the constructor's options, which the checkpoint's
    // load repairs (2.15's restores them itself): the saved options come back either way.
    auto fresh = c.make(m->parameters());
    ck->load_optimizer(*fresh);
    CHECK(c.show(fresh->param_groups()[0].options()) == saved);
    // Both step alike from here: the state and the options came back.
    set_grads(m, 1);
    auto before = flat_values(m->parameters());
    opt->step();
    const auto want = flat_values(m->parameters());
    {
      torch::NoGradGuard no_grad;
      std::size_t i = 0;
      for (auto& p : m->parameters()) {
        auto flat = p.view(-1);
        for (std::int64_t k = 0; k < flat.numel(); ++k) flat[k] = before[i++];
      }
    }
    fresh->step();
    CHECK(flat_values(m->parameters()) == want);

    // Python's optimizer_state.pt carries the same options.
    const std::string script = python_load_state +
        "import sys\n"
        "g = load_state(sys.argv[1])[\"param_groups\"][0]\n"
        "keys = [k for k in g if k != \"params\"]\n"
        "f = lambda v: repr(v) if isinstance(v, bool) else \"%.17g\" % v\n"
        "print(\" \".join(k + \" \" + \" \".join(f(v) for v in (g[k] if isinstance(g[k], tuple) else [g[k]])) for k in keys))\n";
    const auto py = python(script, {(dir / "optimizer_state.pt").string()});
    INFO(py.output);
    REQUIRE(py.status == 0);
    CHECK(py.output == saved + "\n");
  }
}


TEST_CASE("a scheduler object and a vocabulary file round-trip through a kill-and-resume, bitwise equal") {
  Sandbox box;
  auto ref = box.scenario("--name uref --steps 40 --every 5 --user-state 1 --out uref.pt");
  INFO(ref.output);
  REQUIRE(ref.status == 0);
  auto r = box.scenario("--name ukill --steps 40 --every 5 --user-state 1 --kill-step 17 --max-failures 1 --out ukill.pt");
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK(field(r.output, "restarts") == "1");
  // Resumed from checkpoint 3 (step 15), or 2 when 3's write had not finished at the kill.
  CHECK_THAT(r.output, Catch::Contains("RESUMED " + (box.run("ukill") / "checkpoint_00000").string()));
  CHECK_THAT(r.output, Catch::Contains("USER STATE scheduler ok vocabulary ok"));
  CHECK(same_params(box.file("uref.pt"), box.file("ukill.pt")));
  // The scheduler changes the learning rate every step: a run without it ends elsewhere.
  auto plain = box.scenario("--name plain --steps 40 --every 5 --out plain.pt");
  REQUIRE(plain.status == 0);
  CHECK_FALSE(same_params(box.file("uref.pt"), box.file("plain.pt")));

  const auto ck = dtrain::checkpointer::Checkpoint::open(box.run("ukill") / "checkpoint_000008");
  REQUIRE(ck);
  CHECK(ck->file("vocab.txt") == ck->as_directory() / "vocab.txt");
  CHECK(dtrain::checkpointer::detail::read_text(ck->file("vocab.txt")) == "steps 40\n");
  CHECK(ck->has_object("scheduler"));
  CHECK_THROWS_WITH(ck->file("labels.txt"), Catch::Contains("no file \"labels.txt\"") && Catch::Contains("\"vocab.txt\""));
  struct Other {
    void load(torch::serialize::InputArchive&) {}
  } other;
  CHECK_THROWS_WITH(ck->load_object("tokenizer", other), Catch::Contains("no object \"tokenizer\"") &&
                                                             Catch::Contains("\"scheduler\""));
}

TEST_CASE("amp's GradScaler state is restored by ctx.restore: a killed and resumed run scales as an uninterrupted one") {
  Sandbox box;
  auto ref = box.scenario("--name aref --steps 40 --every 5 --amp 1 --out aref.pt");
  INFO(ref.output);
  REQUIRE(ref.status == 0);
  CHECK(field(ref.output, "loss_scale") != "1024");  // it grew during the run
  auto r = box.scenario("--name akill --steps 40 --every 5 --amp 1 --kill-step 17 --max-failures 1 --out akill.pt");
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK(field(r.output, "restarts") == "1");
  CHECK(field(r.output, "loss_scale") == field(ref.output, "loss_scale"));
  CHECK(field(r.output, "skipped_steps") == field(ref.output, "skipped_steps"));
  CHECK(same_params(box.file("aref.pt"), box.file("akill.pt")));
  CHECK(fs::exists(box.run("akill") / "checkpoint_000008" / "precision.pt"));
}

TEST_CASE("a corrupted user file fails the manifest, and the run falls back to the previous checkpoint") {
  Sandbox box;
  auto first = box.scenario("--name uhurt --steps 20 --every 5 --user-state 1");
  INFO(first.output);
  REQUIRE(first.status == 0);
  const auto run = box.run("uhurt");
  const auto c4 = run / "checkpoint_000004";
  std::ofstream(c4 / "files" / "vocab.txt", std::ios::binary | std::ios::in | std::ios::out) << "X";
  CHECK_THAT(dtrain::checkpointer::Checkpoint::verify(c4),
             Catch::Contains("files/vocab.txt") && Catch::Contains("CRC-32"));
  auto r = box.scenario("--name uhurt --steps 25 --every 5 --user-state 1");
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK_THAT(r.output, Catch::Contains("checkpoint " + c4.string() + " is damaged"));
  CHECK_THAT(r.output, Catch::Contains("RESUMED " + (run / "checkpoint_000003").string() + " steps=15"));
  CHECK_THAT(r.output, Catch::Contains("USER STATE scheduler ok vocabulary ok"));
}

TEST_CASE("with_file and with_object refuse bad names, missing files and duplicates") {
  dtrain::checkpointer::Snapshot s;
  s.has_model = true;
  CHECK_THROWS_WITH(s.with_file("../x", "/etc/hostname"), Catch::Contains("cannot name a file"));
  CHECK_THROWS_WITH(s.with_file(".hidden", "/etc/hostname"), Catch::Contains("cannot name a file"));
  CHECK_THROWS_WITH(s.with_file("a.txt", "/nonexistent/a.txt"), Catch::Contains("not a regular file"));
  dtrain::precision::GradScaler scaler(torch::kCPU);
  s.with_object("scaler", scaler);
  CHECK_THROWS_WITH(s.with_object("scaler", scaler), Catch::Contains("added twice"));
}

TEST_CASE("the GradScaler's state round-trips through an archive, and amp's state saves it") {
  dtrain::precision::GradScalerOptions o;
  o.init_scale = 1024;
  o.growth_interval = 3;
  dtrain::precision::GradScaler a(torch::kCPU, o);
  for (bool inf : {false, false, false, true, false}) a.update(inf);  // grow, back off, one clean step
  CHECK(a.scale_value() == 1024);
  CHECK(a.growth_tracker() == 1);
  torch::serialize::OutputArchive out;
  a.save(out);
  std::stringstream bytes;
  out.save_to(bytes);
  dtrain::precision::GradScaler b(torch::kCPU, o);
  torch::serialize::InputArchive in;
  in.load_from(bytes);
  b.load(in);
  CHECK(b.scale_value() == a.scale_value());
  CHECK(b.growth_tracker() == a.growth_tracker());
  CHECK(torch::equal(b.scale_tensor(), a.scale_tensor()));
  // Both go on alike: two more clean steps grow the scale.
  a.update(false), a.update(false), b.update(false), b.update(false);
  CHECK(b.scale_value() == 2048);
  CHECK(b.scale_value() == a.scale_value());

  using amp = dtrain::precision::amp<dtrain::precision::bf16, dtrain::precision::dynamic_loss_scale>;
  amp::state saved(torch::kCPU), restored(torch::kCPU);
  saved.scaler()->update(true);
  const auto archive = dtrain::checkpointer::detail::archive_bytes(saved);
  torch::serialize::InputArchive again;
  std::istringstream is(archive);
  again.load_from(is);
  restored.load(again);
  CHECK(restored.loss_scale() == saved.loss_scale());
  CHECK(restored.loss_scale() == 32768);
  static_assert(!dtrain::checkpointer::SavableState<dtrain::precision::amp<dtrain::precision::bf16>::state>,
                "amp without loss scaling has no state to save");
}

TEST_CASE("checkpoint writes run beside training and their cost is measured") {
  Sandbox box;
  auto r = box.scenario("--name stats --steps 40 --every 5");
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK_THAT(r.output, Catch::Contains("STATS blocked_s="));
  CHECK(std::stod(field(r.output, "write_s")) > 0);
  CHECK(std::stod(field(r.output, "written")) >= 7);
}

TEST_CASE("the run directory records restarts and failures: outcome.json, checkpoints.json, report.html") {
  Sandbox box;
  auto read = [](const fs::path& p) {
    std::ifstream in(p);
    REQUIRE(in);
    return nlohmann::json::parse(in);
  };
  auto text = [](const fs::path& p) {
    std::ifstream in(p);
    return std::string((std::istreambuf_iterator<char>(in)), {});
  };
  // Killed at step 23: one restart, from the latest checkpoint complete then (checkpoint 4, or 3
  // while 4 was still being written), which the scenario prints as "RESUMED <path> steps=N".
  auto r = box.scenario("--name restarted --steps 40 --every 5 --kill-step 23 --max-failures 1 --score score --keep 2");
  INFO(r.output);
  REQUIRE(r.status == 0);
  const auto outcome = read(box.run("restarted") / "outcome.json");
  CHECK(outcome["status"] == "finished");
  CHECK(outcome["restarts"] == 1);
  CHECK(outcome["error"].is_null());
  REQUIRE(outcome["failures"].size() == 1);
  CHECK_THAT(outcome["failures"][0]["cause"].get<std::string>(), Catch::Contains("rank 1 was killed by signal 9"));
  const auto resumed = r.output.find("RESUMED ");
  REQUIRE(resumed != std::string::npos);
  const auto resumed_dir = r.output.substr(resumed + 8, r.output.find(' ', resumed + 8) - resumed - 8);
  const auto resumed_steps = std::stoll(field(r.output.substr(resumed), "steps"));
  CHECK(outcome["failures"][0]["resumed_step"] == resumed_steps);
  CHECK(outcome["failures"][0]["resumed_iteration"] == resumed_steps / 5);
  CHECK(resumed_dir.find(dtrain::RunDirectory::checkpoint_name(resumed_steps / 5)) != std::string::npos);
  CHECK(outcome["end_time"].get<double>() >= outcome["failures"][0]["time"].get<double>());
  // The index: the latest, and the best by score ((steps * 7) % 11 is highest, 10, at step 25).
  const auto index = read(box.run("restarted") / "checkpoints.json");
  CHECK(index["latest"] == "checkpoint_000008");
  CHECK(index["best"] == "checkpoint_000005");
  for (const auto& c : index["checkpoints"]) CHECK(c["score"] == c["metrics"]["score"]);
  const auto html = text(box.run("restarted") / "report.html");
  CHECK_THAT(html, Catch::Contains("class=\"restart\"") && Catch::Contains("rank 1 was killed by signal 9") &&
                       Catch::Contains("resumed from step " + std::to_string(resumed_steps)) &&
                       Catch::Contains("1 restart(s)"));
  const auto params = read(box.run("restarted") / "params.json");
  CHECK(params["failure"]["max_failures"] == 1);
  CHECK(params["policies"]["tracker"]["name"] == "directory");

  // No restart left: failed, with the cause.
  auto f = box.scenario("--name failed --steps 40 --every 5 --kill-step 23 --kill-always 1 --max-failures 1");
  INFO(f.output);
  CHECK(f.status == 3);
  const auto failed = read(box.run("failed") / "outcome.json");
  CHECK(failed["status"] == "failed");
  CHECK(failed["restarts"] == 1);
  CHECK_THAT(failed["error"].get<std::string>(), Catch::Contains("training failed 2 times"));
  CHECK(failed["failures"].size() == 2);
  CHECK_THAT(text(box.run("failed") / "report.html"),
             Catch::Contains("class=\"status failed\"") && Catch::Contains("not restarted (no failures left)"));
}

// ---- issue 18: silent loss and crashes on bad input ----

TEST_CASE("repeated_failure_stops_unlimited_restarts: the same failure from the same step stops max_failures = -1") {
  Sandbox box;
  auto r = box.scenario("--name repeat --steps 40 --every 5 --fail-at-step 7 --max-failures -1");
  INFO(r.output);
  CHECK(r.status == 3);
  CHECK_THAT(r.output, Catch::Contains("the same failure at step 7") &&
                           Catch::Contains("same failure from the same checkpoint step 3 times in a row") &&
                           Catch::Contains("max_repeated_failures = 3") && Catch::Contains("restarting the worker group in 0.2 s"));
}

TEST_CASE("max_steps_then_resume_skips_no_batch: a checkpoint after a break resumes at the batch not trained") {
  Sandbox box;
  reference(box);
  // 22 steps, then a checkpoint after the loop broke out on batch 22 without training it.
  auto first = box.scenario("--name lim --steps 22 --every 5 --final 1");
  INFO(first.output);
  REQUIRE(first.status == 0);
  auto r = box.scenario("--name lim --steps 40 --every 5 --out lim.pt");
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK_THAT(r.output, Catch::Contains("RESUMED") && Catch::Contains("steps=22"));
  CHECK(same_params(box.file("ref.pt"), box.file("lim.pt")));
}

TEST_CASE("end_epoch_resumes_at_next_epoch: a loop that leaves its epoch with ctx.end_epoch() resumes at the next") {
  Sandbox box;
  auto ref = box.scenario("--name eref --epoch-steps 10 --steps 25 --every 5 --out eref.pt");
  INFO(ref.output);
  REQUIRE(ref.status == 0);
  // Epoch 0 ended after 10 steps and epoch 1 ran 3: the checkpoint at 13 resumes epoch 1 at batch 3.
  auto first = box.scenario("--name ecut --epoch-steps 10 --steps 13 --every 5 --final 1");
  REQUIRE(first.status == 0);
  // Epoch 0 ended after 10 steps; the checkpoint after the loop (not the one at step 8) resumes epoch 1.
  auto cut = box.scenario("--name ecut2 --epoch-steps 10 --steps 10 --every 4 --final 1");
  REQUIRE(cut.status == 0);
  auto r = box.scenario("--name ecut2 --epoch-steps 10 --steps 25 --every 5 --out ecut.pt");
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK_THAT(r.output, Catch::Contains("RESUMED"));
  CHECK(same_params(box.file("eref.pt"), box.file("ecut.pt")));
  auto r2 = box.scenario("--name ecut --epoch-steps 10 --steps 25 --every 5 --out ecut13.pt");
  REQUIRE(r2.status == 0);
  CHECK(same_params(box.file("eref.pt"), box.file("ecut13.pt")));
}

TEST_CASE("worker_count_change_mid_epoch_trains_each_sample_once: 3 workers then 2 then 3 within one epoch cover it exactly once") {
  Sandbox box;
  // 1008 samples, 48 a step: 21 steps an epoch under any count. 3 workers train steps 1-6, 2 workers
  // resume at step 6 (global sample offset 288) and train to 12, 3 workers resume at 12 (offset 576)
  // and end the epoch at 21. Each run ends at a checkpoint, so no batch is trained twice.
  const auto trace = box.file("trace");
  fs::create_directories(trace);
  const std::string common = "--name elastic --batch 48 --every 3 --trace '" + trace.string() + "' ";
  auto first = box.scenario(common + "--workers 3 --steps 6");
  INFO(first.output);
  REQUIRE(first.status == 0);
  auto smaller = box.scenario(common + "--workers 2 --steps 12");
  INFO(smaller.output);
  REQUIRE(smaller.status == 0);
  CHECK_THAT(smaller.output, Catch::Contains("RESUMED") && Catch::Contains("steps=6"));
  {  // the checkpoint names the epoch's global offset, whatever the count that wrote it
    std::ifstream in(box.run("elastic") / "checkpoint_000004" / "rank_00001.json");
    const std::string rank1{std::istreambuf_iterator<char>(in), {}};
    CHECK_THAT(rank1, Catch::Contains("\"offset\":576") && Catch::Contains("\"position\":6"));
  }
  auto back = box.scenario(common + "--workers 3 --steps 21");
  INFO(back.output);
  REQUIRE(back.status == 0);
  CHECK_THAT(back.output, Catch::Contains("RESUMED") && Catch::Contains("steps=12"));
  std::map<std::int64_t, int> seen;
  std::map<std::string, std::int64_t> per_file;
  for (const auto& f : fs::directory_iterator(trace)) {
    std::ifstream in(f.path());
    std::int64_t epoch = 0, index = 0, step = 0;
    while (in >> epoch >> index >> step) {
      CHECK(epoch == 0);
      ++seen[index];
      ++per_file[f.path().filename().string()];
    }
  }
  // Three ranks, then two, then three again, each its share of the samples.
  CHECK(per_file == std::map<std::string, std::int64_t>{{"w3_a0_r0", 96 + 144}, {"w3_a0_r1", 96 + 144},
                                                        {"w3_a0_r2", 96 + 144}, {"w2_a0_r0", 144}, {"w2_a0_r1", 144}});
  CHECK(seen.size() == 1008);
  for (const auto& [index, count] : seen) {
    INFO("sample " << index);
    CHECK(count == 1);
  }
}

TEST_CASE("fresh_start_moves_the_old_run_aside: RunConfig::start = fresh keeps the earlier run under another name") {
  Sandbox box;
  REQUIRE(box.scenario("--name fr --steps 10 --every 5").status == 0);
  auto again = box.scenario("--name fr --steps 20 --every 5");  // the same name resumes
  INFO(again.output);
  CHECK_THAT(again.output, Catch::Contains("RESUMED") && Catch::Contains("steps=10"));
  auto r = box.scenario("--name fr --steps 10 --every 5 --fresh 1");
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK_THAT(r.output, !Catch::Contains("RESUMED") && Catch::Contains("the earlier run was moved to"));
  int old_runs = 0;
  for (const auto& e : fs::directory_iterator(box.storage()))
    if (e.path().filename().string().rfind("fr.old-", 0) == 0) {
      ++old_runs;
      CHECK(fs::exists(e.path() / "checkpoint_000004"));
    }
  CHECK(old_runs == 1);
}

TEST_CASE("sampler_seed_at_run_time: the same seed trains bitwise-equal parameters, another seed differs") {
  Sandbox box;
  REQUIRE(box.scenario("--name s5a --steps 12 --every 5 --seed 5 --out s5a.pt").status == 0);
  REQUIRE(box.scenario("--name s5b --steps 12 --every 5 --seed 5 --out s5b.pt").status == 0);
  REQUIRE(box.scenario("--name s6 --steps 12 --every 5 --seed 6 --out s6.pt").status == 0);
  CHECK(same_params(box.file("s5a.pt"), box.file("s5b.pt")));
  CHECK_FALSE(same_params(box.file("s5a.pt"), box.file("s6.pt")));
  // enable_reproducibility(seed): the sampler's seed too, and deterministic algorithms.
  REQUIRE(box.scenario("--name r5a --steps 12 --every 5 --reproducible 5 --out r5a.pt").status == 0);
  REQUIRE(box.scenario("--name r5b --steps 12 --every 5 --reproducible 5 --out r5b.pt").status == 0);
  CHECK(same_params(box.file("r5a.pt"), box.file("r5b.pt")));
  CHECK(same_params(box.file("r5a.pt"), box.file("s5a.pt")));  // the same sampler seed, the same model seeds
}

TEST_CASE("master_port_out_of_range_is_named: MASTER_PORT and MASTER_ADDR that cannot work are named") {
  Sandbox box;
  for (const char* port : {"70000", "-1", "http"}) {
    auto r = box.scenario("--name port --steps 5", std::string("MASTER_PORT=") + port);
    INFO(r.output);
    CHECK(r.status == 3);
    CHECK_THAT(r.output, Catch::Contains(std::string("MASTER_PORT=") + port + " is not a port (1-65535)"));
  }
  auto unresolvable = box.scenario("--name addr --steps 5", "MASTER_ADDR=no-such-host.invalid");
  CHECK_THAT(unresolvable.output, Catch::Contains("MASTER_ADDR=no-such-host.invalid cannot be resolved"));
  auto remote = box.scenario("--name addr --steps 5", "MASTER_ADDR=192.0.2.1");  // TEST-NET-1: never this host
  INFO(remote.output);
  CHECK(remote.status == 3);
  CHECK_THAT(remote.output, Catch::Contains("MASTER_ADDR=192.0.2.1 is not reachable as an address of this host") &&
                                !Catch::Contains("port 0"));
}

TEST_CASE("failed_atomic_write_keeps_the_good_file: a write that fails (a full disk) throws and replaces nothing") {
  Sandbox box;
  const auto path = box.file("outcome.json");
  dtrain::tracking::write_atomically(path, "{\"status\": \"running\"}\n");
  // A file size limit of 16 bytes fails the write as a full disk does (EFBIG instead of ENOSPC).
  std::signal(SIGXFSZ, SIG_IGN);
  rlimit old{};
  getrlimit(RLIMIT_FSIZE, &old);
  rlimit small = old;
  small.rlim_cur = 16;
  REQUIRE(setrlimit(RLIMIT_FSIZE, &small) == 0);
  std::string error;
  try {
    dtrain::tracking::write_atomically(path, std::string(100, 'x'));  // small: the stream buffers it
  } catch (const dtrain::Error& e) {
    error = e.what();
  }
  setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, SIG_DFL);
  CHECK_THAT(error, Catch::Contains("outcome.json.tmp: cannot be written") && Catch::Contains("was left as it was"));
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  CHECK(text.str() == "{\"status\": \"running\"}\n");
  CHECK_FALSE(fs::exists(box.file("outcome.json.tmp")));
}

TEST_CASE("invalid_state_values_are_fallen_back_from: a state.json with iteration 0 or negative steps is not resumed") {
  Sandbox box;
  reference(box);
  for (const auto& [key, value] : std::vector<std::pair<std::string, std::string>>{
           {"iteration", "0"}, {"steps", "-3"}, {"world_size", "0"}}) {
    const std::string name = "bad_" + key;
    REQUIRE(box.scenario("--name " + name + " --steps 20 --every 5").status == 0);
    // Edit the latest checkpoint's state.json and re-seal its manifest, as a tool rewriting it would.
    const auto ck = box.run(name) / "checkpoint_000004";
    auto state = nlohmann::json::parse(std::ifstream(ck / "state.json"));
    state[key] = std::stoll(value);
    std::ofstream(ck / "state.json") << state.dump();
    reseal(ck, "state.json");
    auto r = box.scenario("--name " + name + " --steps 40 --every 5 --out " + name + ".pt");
    INFO(r.output);
    REQUIRE(r.status == 0);
    CHECK_THAT(r.output, Catch::Contains("checkpoint_000003 steps=15") && Catch::Contains(key + " " + value));
    CHECK(same_params(box.file("ref.pt"), box.file(name + ".pt")));
  }
}

TEST_CASE("checkpoint_of_another_model_is_fallen_back_from: a sealed checkpoint that does not load is passed over") {
  Sandbox box;
  reference(box);
  REQUIRE(box.scenario("--name other --steps 10 --every 5 --hidden 48").status == 0);
  REQUIRE(box.scenario("--name mix --steps 10 --every 5").status == 0);
  // The latest checkpoint holds another model's weights under a manifest that verifies (a tool
  // that copied the wrong file and re-sealed it): only loading it can tell.
  const auto ck = box.run("mix") / "checkpoint_000002";
  fs::copy_file(box.run("other") / "checkpoint_000002" / "model.pt", ck / "model.pt", fs::copy_options::overwrite_existing);
  reseal(ck, "model.pt");
  auto r = box.scenario("--name mix --steps 40 --every 5 --out mix.pt");
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK_THAT(r.output, Catch::Contains("checkpoint_000002/model.pt") &&
                           Catch::Contains("restarting the worker group from an older checkpoint") &&
                           Catch::Contains("checkpoint_000002 cannot be loaded into this run") &&
                           Catch::Contains("checkpoint_000001 steps=5"));
  CHECK(same_params(box.file("ref.pt"), box.file("mix.pt")));
  // A restart, but not a failure of the training: max_failures is 0 and the run finished.
  const auto outcome = nlohmann::json::parse(std::ifstream(box.run("mix") / "outcome.json"));
  CHECK(outcome["status"] == "finished");
  CHECK(outcome["restarts"] == 1);
  CHECK(outcome["failures"][0]["counted"] == false);
}

TEST_CASE("checkpoints_of_another_model_stop_the_run: when none loads the run stops and keeps them") {
  Sandbox box;
  REQUIRE(box.scenario("--name other --steps 10 --every 5 --hidden 48").status == 0);
  auto r = box.scenario("--name other --steps 20 --every 5 --max-failures -1");
  INFO(r.output);
  CHECK(r.status == 3);
  CHECK_THAT(r.output, Catch::Contains("checkpoint_000002/model.pt") && Catch::Contains("checkpoint_000001/model.pt") &&
                           Catch::Contains("can be loaded into this run") && Catch::Contains("Start::fresh") &&
                           Catch::Contains("not restarted: a configuration error") &&
                           !Catch::Contains("frame #"));
  // Both are still there: a fresh start would have overwritten them.
  CHECK(fs::exists(box.run("other") / "checkpoint_000001" / "model.pt"));
  CHECK(fs::exists(box.run("other") / "checkpoint_000002" / "model.pt"));
}
