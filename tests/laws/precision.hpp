// SPDX-License-Identifier: Apache-2.0
#pragma once
// Laws of the Precision concept (policy/concepts.hpp), checked for one model on one device:
//   - the autocast() scope gives back the autocast state it found (enabled flag and dtype);
//   - with finite gradients, state.backward(loss) then state.step(optimizer) returns true and leaves
//     the parameters bitwise equal to a twin model's Python GradScaler step, spelled out: its loss
//     computed the same way (in the same autocast scope), (loss * scale).backward(), each gradient
//     times 1 / scale, optimizer.step(), with scale the state's loss_scale() (1 without loss
//     scaling: for fp32 and bf16 it says that the step is a plain step). Not a plain step under
//     fp16 loss scaling: an unscaled fp16 gradient below 2^-14 loses bits (fp16's subnormals) that
//     the scaled one keeps, which is what the scaling is for (torch 2.15 on a CPU showed it);
//   - where the state scales the loss (state::loss_scaling), a step whose gradients hold an inf is
//     skipped: step() returns false, the parameters and the optimizer's state are unchanged,
//     skipped_steps() counts it and loss_scale() backs off; the next finite step steps again.
//     Without loss scaling step() always steps.
// The device is a parameter so that tests/gpu can run the same checker on CUDA.

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <torch/torch.h>

#include <dtrain/concept/precision.hpp>
#include <dtrain/precision/amp.hpp>

#include "../dtrain_catch.hpp"

namespace dtrain_laws::precision {

namespace detail {
inline torch::nn::Sequential twin_models(torch::nn::Sequential& twin, torch::Device device) {
  using namespace torch::nn;
  torch::manual_seed(11);
  Sequential model(Linear(8, 16), Tanh(), Linear(16, 4));
  twin = Sequential(Linear(8, 16), Tanh(), Linear(16, 4));
  {
    torch::NoGradGuard no_grad;
    auto a = model->parameters(), b = twin->parameters();
    for (std::size_t i = 0; i < a.size(); ++i) b[i].copy_(a[i]);
  }
  model->to(device);
  twin->to(device);
  return model;
}

inline bool bitwise_equal(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!torch::equal(a[i].cpu(), b[i].cpu())) return false;
  return true;
}

inline std::vector<torch::Tensor> snapshot(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> out;
  for (const auto& p : params) out.push_back(p.detach().clone());
  return out;
}

// state::loss_scaling is optional: absent means no loss scaling.
template <class State>
constexpr bool scales_loss() {
  if constexpr (requires { State::loss_scaling; }) return State::loss_scaling;
  else return false;
}

inline bool autocast_on(torch::Device device) {
  return dtrain::compat::autocast_enabled(device.type());
}
inline at::ScalarType autocast_type(torch::Device device) {
  return dtrain::compat::autocast_dtype(device.type());
}
}  // namespace detail

/// Checks every law above for the Precision policy P on `device`.
template <class P>
void check(torch::Device device = torch::kCPU) {
  using state_type = typename P::state;
  constexpr bool scales = detail::scales_loss<state_type>();

  SECTION("autocast() gives back the autocast state it found") {
    state_type state(device);
    const bool was_on = detail::autocast_on(device);
    const auto was_type = detail::autocast_type(device);
    {
      auto outer = state.autocast();
      {
        auto inner = state.autocast();
      }
    }
    CHECK(detail::autocast_on(device) == was_on);
    CHECK(detail::autocast_type(device) == was_type);
  }

  SECTION("with finite gradients a step equals a plain optimizer step, bitwise") {
    torch::nn::Sequential twin;
    auto model = detail::twin_models(twin, device);
    torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    torch::optim::SGD plain(twin->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    state_type state(device);
    const auto initial = detail::snapshot(model->parameters());
    torch::manual_seed(12);
    for (int step = 0; step < 3; ++step) {
      INFO("step " << step);
      const auto x = torch::randn({32, 8}).to(device);
      const auto y = torch::randint(0, 4, {32}).to(device);
      torch::Tensor loss, twin_loss;
      {
        auto scope = state.autocast();
        loss = torch::nn::functional::cross_entropy(model->forward(x), y);
        twin_loss = torch::nn::functional::cross_entropy(twin->forward(x), y);
      }
      opt.zero_grad();
      plain.zero_grad();
      const double scale = dtrain::precision_traits<P>::loss_scale(state);
      INFO("loss scale " << scale);
      state.backward(loss);
      (twin_loss * scale).backward();
      {
        torch::NoGradGuard no_grad;
        const auto inv_scale = torch::tensor(1.0 / scale, torch::kFloat);
        for (auto& p : twin->parameters()) p.mutable_grad().mul_(inv_scale.to(p.scalar_type()));
      }
      CHECK(state.step(opt));
      plain.step();
      CHECK(detail::bitwise_equal(model->parameters(), twin->parameters()));
    }
    CHECK_FALSE(detail::bitwise_equal(model->parameters(), initial));  // the steps moved the weights
  }

  SECTION("an inf gradient: skipped under loss scaling, stepped without") {
    torch::nn::Sequential twin;
    auto model = detail::twin_models(twin, device);
    torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-2));
    state_type state(device);
    const auto x = torch::randn({16, 8}).to(device);
    const auto y = torch::randint(0, 4, {16}).to(device);
    auto backward = [&] {
      opt.zero_grad();
      torch::Tensor loss;
      {
        auto scope = state.autocast();
        loss = torch::nn::functional::cross_entropy(model->forward(x), y);
      }
      state.backward(loss);
    };
    const auto before = detail::snapshot(model->parameters());
    double scale_before = 1;
    if constexpr (scales) scale_before = state.loss_scale();
    backward();
    model->parameters()[0].mutable_grad().view({-1})[3] = std::numeric_limits<float>::infinity();
    const bool stepped = state.step(opt);
    if constexpr (scales) {
      CHECK_FALSE(stepped);
      CHECK(state.loss_scale() < scale_before);
      CHECK(detail::bitwise_equal(model->parameters(), before));
      CHECK(opt.state().empty());  // Adam's moments were never created
      CHECK(state.skipped_steps() == 1);
      // The next clean step steps, with the backed-off scale.
      backward();
      CHECK(state.step(opt));
      CHECK_FALSE(detail::bitwise_equal(model->parameters(), before));
      CHECK(state.skipped_steps() == 1);
    } else {
      CHECK(stepped);  // nothing decides to skip without loss scaling
      CHECK_FALSE(detail::bitwise_equal(model->parameters(), before));
    }
  }
}

}  // namespace dtrain_laws::precision
