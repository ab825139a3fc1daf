// SPDX-License-Identifier: Apache-2.0
// Snapshot buffers (issue 15's stall): ctx.checkpoint() copies the model and the optimizer's state
// into the previous snapshot's tensors once that write is done. A checkpoint written from reused
// buffers must be bitwise the one written from fresh copies: here against the copies made before
// (named_state, renew_state_tensors without buffers) over consecutive snapshots with training in
// between, with a snapshot still held (no reuse), with a parameter that changes shape, and through
// the scenarios program (real workers, directory<> asynchronous and synchronous).

#include "../dtrain_catch.hpp"
#include "../run_command.hpp"

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <unistd.h>
#include <vector>

#include <torch/torch.h>

#include <dtrain/checkpointer/snapshot_buffers.hpp>
#include <dtrain/checkpointer/write.hpp>

namespace fs = std::filesystem;
using namespace dtrain::checkpointer::detail;

namespace {

// A model with a tensor of 2 MiB and more (huge-page memory when new), small ones and buffers.
torch::nn::Sequential net() {
  using namespace torch::nn;
  return Sequential(Linear(32, 768), BatchNorm1d(768), Tanh(), Linear(768, 768), Tanh(), Linear(768, 4));
}

// One model and its optimizer, stepped on the same batches as its twin.
struct Trained {
  torch::nn::Sequential model;
  torch::optim::Adam adam;
  explicit Trained(torch::nn::Sequential m)
      : model(std::move(m)), adam(model->parameters(), torch::optim::AdamOptions(1e-2).amsgrad(true)) {}
  void step(const torch::Tensor& x) {
    adam.zero_grad();
    model->forward(x).pow(2).mean().backward();
    adam.step();
  }
};

// What a snapshot holds for the writer, as ctx.checkpoint() takes it under ddp<>.
struct Taken {
  c10::Dict<std::string, at::Tensor> model;
  std::shared_ptr<torch::serialize::OutputArchive> archive;
  std::optional<c10::IValue> python;
  // The bytes of model.pt and optimizer_state.pt the writer makes of it.
  std::string model_bytes() const { return torch_save_bytes(c10::IValue(model)); }
  std::string python_bytes() const { return torch_save_bytes(*python); }
};

Taken take(Trained& t, SnapshotBuffers* buffers) {
  Taken s;
  s.model = buffers ? buffers->model_state(*t.model) : named_state(*t.model, true);
  s.archive = std::make_shared<torch::serialize::OutputArchive>();
  t.adam.save(*s.archive);
  s.python = python_optimizer_state(t.adam, /*copy=*/false);
  REQUIRE(s.python);
  REQUIRE(renew_state_tensors(t.adam, buffers));
  if (buffers) buffers->finish();
  return s;
}

std::int64_t tensors_in(const Trained& t) {  // the model's and Adam's (amsgrad: three per parameter)
  return static_cast<std::int64_t>(t.model->parameters().size() * 4 + t.model->buffers().size());
}

}  // namespace

TEST_CASE("snapshots copied into the previous snapshot's buffers write the bytes fresh copies write") {
  torch::manual_seed(3);
  Trained fresh(net());
  Trained reused(net());
  for (std::size_t i = 0; i < fresh.model->parameters().size(); ++i) {
    torch::NoGradGuard no_grad;
    reused.model->parameters()[i].copy_(fresh.model->parameters()[i]);
  }
  SnapshotBuffers buffers;
  auto both_step = [&] {
    const auto x = torch::randn({16, 32});
    fresh.step(x);
    reused.step(x);
  };
  both_step();
  for (int k = 0; k < 4; ++k) {
    INFO("snapshot " << k);
    const Taken a = take(fresh, nullptr);
    const Taken b = take(reused, &buffers);
    // Training goes on while the writer serializes (asynchronous): the snapshot keeps its moment.
    both_step();
    both_step();
    CHECK(a.model_bytes() == b.model_bytes());
    CHECK(a.python_bytes() == b.python_bytes());
    // From the second snapshot on every tensor goes into the previous one's memory.
    CHECK(buffers.reused() == k * tensors_in(reused));
    CHECK(buffers.allocated() == tensors_in(reused));
  }  // the write is done: a and b are gone
  // The optimizer went on with the reused buffers as state: training is unchanged by them.
  for (std::size_t i = 0; i < fresh.model->parameters().size(); ++i)
    CHECK(torch::equal(fresh.model->parameters()[i], reused.model->parameters()[i]));
  CHECK(take(fresh, nullptr).python_bytes() == take(reused, &buffers).python_bytes());
}

TEST_CASE("a snapshot still referenced is not copied into and keeps its values") {
  torch::manual_seed(4);
  Trained t(net());
  SnapshotBuffers buffers;
  t.step(torch::randn({16, 32}));
  const Taken held = take(t, &buffers);
  const auto held_model = held.model_bytes(), held_python = held.python_bytes();
  for (int k = 0; k < 2; ++k) {
    t.step(torch::randn({16, 32}));
    const auto expected_model = torch_save_bytes(c10::IValue(named_state(*t.model, true)));
    const auto expected_python = torch_save_bytes(*python_optimizer_state(t.adam));
    const Taken next = take(t, &buffers);
    CHECK(next.model_bytes() == expected_model);
    CHECK(next.python_bytes() == expected_python);
    if (k == 0) CHECK(buffers.reused() == 0);  // `held` still references every kept buffer
  }
  CHECK(held.model_bytes() == held_model);
  CHECK(held.python_bytes() == held_python);
}

TEST_CASE("a parameter that changes shape or appears between snapshots is copied into new memory") {
  struct Grow : torch::nn::Module {
    torch::Tensor w = register_parameter("w", torch::randn({3, 4}));
  };
  torch::manual_seed(5);
  auto m = std::make_shared<Grow>();
  SnapshotBuffers buffers;
  auto state = buffers.model_state(*m);
  buffers.finish();
  state = c10::Dict<std::string, at::Tensor>();  // written
  {
    torch::NoGradGuard no_grad;
    m->w.set_(torch::randn({5, 4}));  // the same parameter, another shape
  }
  m->register_parameter("v", torch::randn({2}));
  state = buffers.model_state(*m);
  buffers.finish();
  CHECK(buffers.reused() == 0);
  CHECK(buffers.allocated() == 3);
  CHECK(torch_save_bytes(c10::IValue(state)) == torch_save_bytes(c10::IValue(named_state(*m, true))));
  CHECK(state.at("w").sizes() == torch::IntArrayRef({5, 4}));
  // A non-contiguous parameter (a transposed view) is cloned as clone() lays it out.
  {
    torch::NoGradGuard no_grad;
    m->w.set_(torch::randn({4, 5}).t());
  }
  state = c10::Dict<std::string, at::Tensor>();
  state = buffers.model_state(*m);
  CHECK(torch_save_bytes(c10::IValue(state)) == torch_save_bytes(c10::IValue(named_state(*m, true))));
}

namespace {

std::string file_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  REQUIRE(in);
  return {std::istreambuf_iterator<char>(in), {}};
}

void run_scenario(const std::string& args) {
  const auto r = dtrain_test::run_command(std::string("'") + SCENARIOS_BIN + "' " + args);
  INFO(r.output);
  REQUIRE(r.status == 0);
}

}  // namespace

TEST_CASE("checkpoints of real workers are bitwise equal with reused buffers and with fresh copies, async and sync") {
  std::random_device rd;
  const fs::path dir = fs::temp_directory_path() / ("dtrain_snapshot_buffers_" + std::to_string(rd()) + std::to_string(getpid()));
  fs::create_directories(dir);
  for (const std::string sync : {"0", "1"}) {
    INFO("--sync " << sync);
    const std::string common = "--storage '" + dir.string() + "' --workers 2 --steps 40 --every 5 --seed 11 --python-optimizer 1 --sync " + sync;
    run_scenario(common + " --name reused --out '" + (dir / "reused.pt").string() + "'");
    run_scenario(common + " --name held --hold-snapshots 1 --out '" + (dir / "held.pt").string() + "'");
    int compared = 0;
    for (int it = 1; it <= 8; ++it) {
      char name[32];
      std::snprintf(name, sizeof name, "checkpoint_%06d", it);
      INFO(name);
      for (const char* file : {"model.pt", "optimizer_state.pt", "rank_00000.json", "rank_00001.json"}) {
        INFO(file);
        CHECK(file_bytes(dir / "reused" / name / file) == file_bytes(dir / "held" / name / file));
        ++compared;
      }
    }
    CHECK(compared == 32);
    std::vector<torch::Tensor> trained_reused, trained_held;  // the parameters at the end
    torch::load(trained_reused, (dir / "reused.pt").string());
    torch::load(trained_held, (dir / "held.pt").string());
    REQUIRE(trained_reused.size() == trained_held.size());
    for (std::size_t i = 0; i < trained_reused.size(); ++i) CHECK(torch::equal(trained_reused[i], trained_held[i]));
    fs::remove_all(dir / "reused");
    fs::remove_all(dir / "held");
  }
  fs::remove_all(dir);
}
