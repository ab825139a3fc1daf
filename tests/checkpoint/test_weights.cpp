// SPDX-License-Identifier: Apache-2.0
// Weights from Python: /usr/bin/python3 (python3-torch) builds a model, saves its state_dict with
// torch.save, and the C++ module of the same architecture loads it by name and computes the same
// outputs; strict and non-strict loads report what did not match; shapes are checked, float64
// weights rounded into a float32 module.

#include "../dtrain_catch.hpp"
#include "../run_command.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include <torch/torch.h>

#include <dtrain/weights.hpp>

namespace fs = std::filesystem;

namespace {

struct Dir {
  fs::path path;
  Dir() {
    std::random_device rd;
    path = fs::temp_directory_path() / ("dtrain_weights_" + std::to_string(rd()) + std::to_string(getpid()));
    fs::create_directories(path);
  }
  ~Dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string operator/(const std::string& n) const { return (path / n).string(); }
};

std::pair<int, std::string> python(const std::string& script, const std::string& dir) {
  auto r = dtrain_test::run_command(std::string(PYTHON3) + " -c '" + script + "' '" + dir + "'");
  return {r.status, std::move(r.output)};
}

// The Python model and the C++ one: the same layers under the same names ("0", "1", ...).
const std::string python_model =
    "import sys, os, torch\n"
    "from torch import nn\n"
    "d = sys.argv[1]\n"
    "torch.manual_seed(0)\n"
    "def net(width=4):\n"
    "    return nn.Sequential(nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(), nn.Flatten(),\n"
    "                         nn.Linear(width * 25, 10))\n";

torch::nn::Sequential cpp_net(std::int64_t width = 4) {
  using namespace torch::nn;
  return Sequential(Conv2d(Conv2dOptions(3, width, 3).padding(1)), BatchNorm2d(width), ReLU(), Flatten(),
                    Linear(width * 25, 10));
}

// Writes, in `dir`: sd.pt (the model's state_dict, BatchNorm statistics made non-trivial), ddp.pt
// (the same under "module."), io.pt (an input and the eval-mode output), double.pt (the model in
// float64), layout.pt (views that share a storage, a transposed tensor, half, bfloat16, int and
// bool tensors).
void save_from_python(const Dir& dir) {
  const auto [status, out] = python(python_model +
      "m = net()\n"
      "with torch.no_grad():\n"
      "    m[1].running_mean.uniform_(-1, 1)\n"
      "    m[1].running_var.uniform_(0.5, 2)\n"
      "    m[1].weight.uniform_(0.5, 1.5)\n"
      "    m[1].bias.uniform_(-0.5, 0.5)\n"
      "    m[1].num_batches_tracked.fill_(7)\n"
      "m.eval()\n"
      "torch.save(m.state_dict(), os.path.join(d, \"sd.pt\"))\n"
      "sd = m.state_dict()\n"
      "torch.save(type(sd)((\"module.\" + k, v) for k, v in sd.items()), os.path.join(d, \"ddp.pt\"))\n"
      "x = torch.randn(2, 3, 5, 5)\n"
      "torch.save({\"x\": x, \"y\": m(x).detach()}, os.path.join(d, \"io.pt\"))\n"
      "torch.save(m.double().state_dict(), os.path.join(d, \"double.pt\"))\n"
      "base = torch.arange(12, dtype=torch.float32)\n"
      "torch.save({\"whole\": base, \"tail\": base[5:], \"t\": base.reshape(3, 4).t(),\n"
      "            \"half\": base.half(), \"bf16\": base.bfloat16(), \"i64\": base.long() - 6, \"flag\": base > 5},\n"
      "           os.path.join(d, \"layout.pt\"))\n"
      "print(\"saved\")\n", dir.path.string());
  INFO(out);
  REQUIRE(status == 0);
}

std::map<std::string, torch::Tensor> as_map(const std::vector<std::pair<std::string, torch::Tensor>>& v) {
  return {v.begin(), v.end()};
}

}  // namespace

TEST_CASE("a state_dict saved by Python's torch.save loads into the C++ module and computes the same outputs") {
  Dir dir;
  save_from_python(dir);
  auto io = as_map(dtrain::weights::read_python_state_dict(dir / "io.pt"));
  for (const auto* file : {"sd.pt", "ddp.pt"}) {  // ddp.pt: every key under "module."
    INFO(file);
    auto m = cpp_net();
    const auto report = dtrain::weights::load_python_state_dict(*m, dir / file);
    CHECK(report.complete());
    CHECK(report.loaded == 9);  // weight and bias of conv, BatchNorm and Linear; two statistics; the counter
    m->eval();
    torch::NoGradGuard no_grad;
    const auto y = m->forward(io.at("x"));
    CHECK(torch::allclose(y, io.at("y"), /*rtol=*/0, /*atol=*/1e-5));
    CHECK(m->named_buffers()["1.num_batches_tracked"].item<std::int64_t>() == 7);
  }
  // Storage sharing, offsets, strides and dtypes come through as Python saved them.
  const auto layout = as_map(dtrain::weights::read_python_state_dict(dir / "layout.pt"));
  const auto base = torch::arange(12, torch::kFloat);
  CHECK(torch::equal(layout.at("whole"), base));
  CHECK(torch::equal(layout.at("tail"), base.slice(0, 5)));
  CHECK(torch::equal(layout.at("t"), base.reshape({3, 4}).t()));
  CHECK(torch::equal(layout.at("half"), base.to(torch::kHalf)));
  CHECK(torch::equal(layout.at("bf16"), base.to(torch::kBFloat16)));
  CHECK(torch::equal(layout.at("i64"), base.to(torch::kLong) - 6));
  CHECK(torch::equal(layout.at("flag"), base > 5));
}

TEST_CASE("strict and non-strict loads of Python weights list the missing and unexpected names") {
  Dir dir;
  save_from_python(dir);
  // The C++ module has one more layer: "5.weight" and "5.bias" are not in the file.
  auto bigger = cpp_net();
  bigger->push_back(torch::nn::Linear(10, 3));
  CHECK_THROWS_WITH(dtrain::weights::load_python_state_dict(*bigger, dir / "sd.pt"),
                    Catch::Contains("strict load") && Catch::Contains("missing from the file \"5.weight\", \"5.bias\"") &&
                        Catch::Contains("unexpected in the file none") && Catch::Contains("{.strict = false}"));
  auto r = dtrain::weights::load_python_state_dict(*bigger, dir / "sd.pt", {.strict = false});
  CHECK(r.missing == std::vector<std::string>{"5.weight", "5.bias"});
  CHECK(r.unexpected.empty());
  CHECK(r.loaded == 9);
  // The module lacks the classifier the file has: the file's "4.weight" and "4.bias" are unexpected.
  using namespace torch::nn;
  Sequential backbone(Conv2d(Conv2dOptions(3, 4, 3).padding(1)), BatchNorm2d(4));
  CHECK_THROWS_WITH(dtrain::weights::load_python_state_dict(*backbone, dir / "ddp.pt"),
                    Catch::Contains("unexpected in the file \"4.bias\", \"4.weight\""));
  r = dtrain::weights::load_python_state_dict(*backbone, dir / "ddp.pt", {.strict = false});
  CHECK(r.missing.empty());
  CHECK(r.unexpected == std::vector<std::string>{"4.bias", "4.weight"});
  const auto sd = as_map(dtrain::weights::read_python_state_dict(dir / "sd.pt"));
  CHECK(torch::equal(backbone->named_parameters()["0.weight"], sd.at("0.weight")));
}

TEST_CASE("Python weights of another shape are refused naming the key, float64 ones are rounded") {
  Dir dir;
  save_from_python(dir);
  auto wider = cpp_net(8);
  CHECK_THROWS_WITH(dtrain::weights::load_python_state_dict(*wider, dir / "sd.pt", {.strict = false}),
                    Catch::Contains("\"0.weight\" has shape [4, 3, 3, 3]") && Catch::Contains("[8, 3, 3, 3]"));
  // Floating-point tensors convert as PyTorch's load_state_dict copies them (other dtypes are
  // refused: weights_test.cpp).
  auto m = cpp_net();
  CHECK(dtrain::weights::load_python_state_dict(*m, dir / "double.pt").loaded == 9);
  const auto sd64 = as_map(dtrain::weights::read_python_state_dict(dir / "double.pt"));
  CHECK(sd64.at("0.weight").scalar_type() == torch::kDouble);
  CHECK(m->named_parameters()["0.weight"].scalar_type() == torch::kFloat);
  CHECK(torch::equal(m->named_parameters()["0.weight"], sd64.at("0.weight").to(torch::kFloat)));
  // Not a torch.save file, and no file at all.
  std::ofstream(dir / "bad.pt") << "not a zip";
  CHECK_THROWS_WITH(dtrain::weights::load_python_state_dict(*m, dir / "bad.pt"),
                    Catch::Contains("bad.pt") && Catch::Contains("not a zip-format torch.save file"));
  CHECK_THROWS_WITH(dtrain::weights::load_python_state_dict(*m, dir / "none.pt"), Catch::Contains("no such file"));
}
