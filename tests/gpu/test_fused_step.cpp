// SPDX-License-Identifier: Apache-2.0
// ctx.step's fused optimizer step on the GPU (precision/optimizer_step.hpp): the same update and
// the same optimizer state as opt.step(), for every option of SGD, Adam and AdamW.

#include "../dtrain_catch.hpp"

#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include <torch/torch.h>

#include <dtrain/all.hpp>

namespace {

namespace d = dtrain;
const torch::Device gpu(torch::kCUDA, 0);

// Two conv-free layers and a bias-free one: sizes that split across the kernels' chunks unevenly.
std::vector<torch::Tensor> parameters() {
  torch::manual_seed(5);
  std::vector<torch::Tensor> ps;
  for (auto shape : {std::vector<std::int64_t>{300, 70}, {300}, {70, 1000}, {7}})
    ps.push_back(torch::randn(shape, torch::TensorOptions(gpu)).requires_grad_(true));
  return ps;
}

std::vector<torch::Tensor> copy(const std::vector<torch::Tensor>& ps) {
  std::vector<torch::Tensor> out;
  for (const auto& p : ps) out.push_back(p.detach().clone().requires_grad_(true));
  return out;
}

// Gradients for step `step`, the same on both sides; the last parameter has none on odd steps
// (its Adam step count falls behind, so the fused path meets two step counts at once).
void set_grads(std::vector<torch::Tensor>& ps, int step) {
  auto gen = at::detail::createCPUGenerator(100 + step);
  for (std::size_t i = 0; i < ps.size(); ++i) {
    if (i + 1 == ps.size() && step % 2 == 1) {
      ps[i].mutable_grad() = torch::Tensor();
      continue;
    }
    ps[i].mutable_grad() = at::randn(ps[i].sizes(), gen).to(gpu);
  }
}

void require_close(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b, const std::string& what) {
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    INFO(what << " " << i << ": largest difference " << (a[i] - b[i]).abs().max().item<double>());
    REQUIRE(torch::allclose(a[i], b[i], 1e-5, 1e-6));
  }
}

// Six steps through opt.step() and through optimizer_step(); parameters and state must agree,
// and a plain opt.step() continues from the state the fused steps left.
template <class Optimizer, class State>
void check(const std::string& name, std::function<Optimizer(std::vector<torch::Tensor>)> make,
           std::function<std::vector<torch::Tensor>(const State&)> state_tensors) {
  INFO(name);
  auto plain_params = parameters();
  auto fused_params = copy(plain_params);
  auto plain = make(plain_params);
  auto fused = make(fused_params);
  for (int step = 0; step < 6; ++step) {
    set_grads(plain_params, step);
    set_grads(fused_params, step);
    plain.step();
    REQUIRE(d::precision::optimizer_step(fused));
  }
  require_close(fused_params, plain_params, "parameter");
  for (std::size_t i = 0; i < plain_params.size(); ++i) {
    // SGD without momentum keeps no state: then neither side may.
    const auto a = fused.state().find(d::compat::optimizer_state_key(fused_params[i]));
    const auto b = plain.state().find(d::compat::optimizer_state_key(plain_params[i]));
    REQUIRE((a == fused.state().end()) == (b == plain.state().end()));
    if (b == plain.state().end()) continue;
    require_close(state_tensors(static_cast<State&>(*a->second)), state_tensors(static_cast<State&>(*b->second)),
                  "state of parameter");
  }
  // The state serialises and a plain step continues from it.
  std::stringstream saved;
  torch::save(fused, saved);
  auto resumed_params = copy(fused_params);
  auto resumed = make(resumed_params);
  torch::load(resumed, saved);
  set_grads(resumed_params, 6);
  set_grads(plain_params, 6);
  resumed.step();
  plain.step();
  require_close(resumed_params, plain_params, "after a plain step from the fused state");
}

}  // namespace

TEST_CASE("fused optimizer steps equal opt.step(): SGD with every option", "[gpu][fused]") {
  REQUIRE(d::precision::fused_optimizer_steps);
  using O = torch::optim::SGDOptions;
  const std::vector<std::pair<std::string, O>> cases{
      {"plain", O(0.1)},
      {"momentum and weight decay", O(0.1).momentum(0.9).weight_decay(1e-2)},
      {"nesterov", O(0.05).momentum(0.9).nesterov(true)},
      {"dampening", O(0.05).momentum(0.8).dampening(0.3)}};
  for (const auto& [name, options] : cases)
    check<torch::optim::SGD, torch::optim::SGDParamState>(
        "SGD " + name, [&](std::vector<torch::Tensor> ps) { return torch::optim::SGD(ps, options); },
        [](const torch::optim::SGDParamState& s) {
          return s.momentum_buffer().defined() ? std::vector<torch::Tensor>{s.momentum_buffer()}
                                               : std::vector<torch::Tensor>{};
        });
}

TEST_CASE("fused optimizer steps equal opt.step(): Adam and AdamW, amsgrad, step counts", "[gpu][fused]") {
  for (bool amsgrad : {false, true}) {
    check<torch::optim::Adam, torch::optim::AdamParamState>(
        std::string("Adam amsgrad ") + (amsgrad ? "on" : "off"),
        [&](std::vector<torch::Tensor> ps) {
          return torch::optim::Adam(ps, torch::optim::AdamOptions(1e-2).weight_decay(0.01).amsgrad(amsgrad));
        },
        [&](const torch::optim::AdamParamState& s) {
          CHECK(s.step() > 0);
          std::vector<torch::Tensor> v{s.exp_avg(), s.exp_avg_sq(), torch::tensor(double(s.step()))};
          if (amsgrad) v.push_back(s.max_exp_avg_sq());
          return v;
        });
    check<torch::optim::AdamW, torch::optim::AdamWParamState>(
        std::string("AdamW amsgrad ") + (amsgrad ? "on" : "off"),
        [&](std::vector<torch::Tensor> ps) {
          return torch::optim::AdamW(ps, torch::optim::AdamWOptions(1e-2).weight_decay(0.05).amsgrad(amsgrad));
        },
        [&](const torch::optim::AdamWParamState& s) {
          std::vector<torch::Tensor> v{s.exp_avg(), s.exp_avg_sq(), torch::tensor(double(s.step()))};
          if (amsgrad) v.push_back(s.max_exp_avg_sq());
          return v;
        });
  }
}

namespace {
struct CountingSGD : torch::optim::SGD {
  using torch::optim::SGD::SGD;
  int calls = 0;
  torch::Tensor step(LossClosure closure = nullptr) override {
    ++calls;
    return torch::optim::SGD::step(closure);
  }
};
}  // namespace

TEST_CASE("fused optimizer steps: a subclass, CPU tensors and a mixed dtype take opt.step()", "[gpu][fused]") {
  auto ps = parameters();
  set_grads(ps, 0);
  CountingSGD sub(ps, torch::optim::SGDOptions(0.1).momentum(0.9));
  CHECK_FALSE(d::precision::optimizer_step(sub));
  CHECK(sub.calls == 1);

  auto cpu = torch::randn({4, 4}).requires_grad_(true);
  cpu.mutable_grad() = torch::ones({4, 4});
  torch::optim::SGD on_cpu({cpu}, torch::optim::SGDOptions(0.1));
  CHECK_FALSE(d::precision::optimizer_step(on_cpu));
  CHECK(torch::allclose(cpu.grad(), torch::ones({4, 4})));

  auto half = torch::randn({8}, torch::TensorOptions(gpu).dtype(torch::kHalf)).requires_grad_(true);
  half.mutable_grad() = torch::ones_like(half);
  auto full = ps[0];
  torch::optim::AdamW mixed({full, half}, torch::optim::AdamWOptions(1e-3));
  CHECK_FALSE(d::precision::optimizer_step(mixed));
}

TEST_CASE("fused optimizer steps: ctx.step under amp<bf16> trains with AdamW's fused kernel", "[gpu][fused]") {
  torch::manual_seed(3);
  torch::nn::Linear model(32, 4);
  model->to(gpu);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-2));
  d::precision::amp<d::precision::bf16>::state precision(gpu);
  const auto x = torch::randn({64, 32}, torch::TensorOptions(gpu));
  const auto y = torch::randint(0, 4, {64}, torch::TensorOptions(gpu).dtype(torch::kLong));
  double first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    opt.zero_grad();
    torch::Tensor loss;
    {
      auto scope = precision.autocast();
      loss = torch::nn::functional::cross_entropy(model(x).to(torch::kFloat), y);
    }
    precision.backward(loss);
    REQUIRE(precision.step(opt));
    (step == 0 ? first : last) = loss.item<double>();
  }
  CHECK(last < 0.5 * first);
  auto& state = static_cast<torch::optim::AdamWParamState&>(*opt.state().at(d::compat::optimizer_state_key(model->weight)));
  CHECK(state.step() == 30);
}
