// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of recompute.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <mutex>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/custom_class.h>

#include <dtrain/detail/torch_compat.hpp>
#include <dtrain/nn/recompute.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace nn {
namespace detail {

// What the recomputation needs: the function, and the random-number and autocast states it ran under.
struct RecomputeState : torch::CustomClassHolder {
  std::function<torch::Tensor(const torch::Tensor&)> fn;
  bool x_needs_grad = false;
  torch::Tensor cpu_rng, device_rng;
  c10::optional<at::Device> device;  // the input's accelerator, whose generator dropout draws from
  bool autocast_cpu = false, autocast_cuda = false;
  at::ScalarType autocast_cpu_dtype = at::kBFloat16, autocast_cuda_dtype = at::kHalf;
};

inline at::Generator generator_of(const c10::optional<at::Device>& device) {
  return device ? at::globalContext().defaultGenerator(*device) : at::detail::getDefaultCPUGenerator();
}

inline torch::Tensor rng_state(const c10::optional<at::Device>& device) {
  auto gen = generator_of(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

inline void set_rng_state(const c10::optional<at::Device>& device, const torch::Tensor& state) {
  auto gen = generator_of(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

struct RecomputeFunction : torch::autograd::Function<RecomputeFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, c10::intrusive_ptr<RecomputeState> state,
                               const torch::Tensor& x, at::TensorList params) {
    ctx->save_for_backward({x});
    ctx->saved_data["params"] = params.vec();
    ctx->saved_data["state"] = c10::IValue::make_capsule(state);
    return state->fn(x);  // grad mode is off in a Function's forward: no activation is kept
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grads) {
    const auto state = c10::static_intrusive_pointer_cast<RecomputeState>(ctx->saved_data["state"].toCapsule());
    const auto params = ctx->saved_data["params"].toTensorVector();
    const auto x = ctx->get_saved_variables()[0].detach().requires_grad_(state->x_needs_grad);

    // The forward again, drawing what it drew and autocast as it was; the caller's states after.
    const auto cpu_now = rng_state(c10::nullopt);
    const auto device_now = state->device ? rng_state(state->device) : torch::Tensor();
    set_rng_state(c10::nullopt, state->cpu_rng);
    if (state->device) set_rng_state(state->device, state->device_rng);
    const bool cpu_was = compat::autocast_enabled(at::kCPU), cuda_was = compat::autocast_enabled(at::kCUDA);
    const auto cpu_dtype_was = compat::autocast_dtype(at::kCPU), cuda_dtype_was = compat::autocast_dtype(at::kCUDA);
    compat::set_autocast(at::kCPU, state->autocast_cpu, state->autocast_cpu_dtype);
    compat::set_autocast(at::kCUDA, state->autocast_cuda, state->autocast_cuda_dtype);
    torch::Tensor out;
    try {
      torch::AutoGradMode grad_mode(true);
      out = state->fn(x);
    } catch (...) {
      compat::set_autocast(at::kCPU, cpu_was, cpu_dtype_was);
      compat::set_autocast(at::kCUDA, cuda_was, cuda_dtype_was);
      throw;
    }
    compat::set_autocast(at::kCPU, cpu_was, cpu_dtype_was);
    compat::set_autocast(at::kCUDA, cuda_was, cuda_dtype_was);
    set_rng_state(c10::nullopt, cpu_now);
    if (state->device) set_rng_state(state->device, device_now);

    std::vector<torch::Tensor> wrt;
    if (state->x_needs_grad) wrt.push_back(x);
    for (const auto& p : params)
      if (p.requires_grad()) wrt.push_back(p);
    const auto found = torch::autograd::grad({out}, wrt, {grads[0]}, /*retain_graph=*/false, /*create_graph=*/false,
                                             /*allow_unused=*/true);
    // One gradient per forward input: the state (none), x, then each parameter.
    torch::autograd::variable_list result{torch::Tensor()};
    std::size_t next = 0;
    result.push_back(state->x_needs_grad ? found[next++] : torch::Tensor());
    for (const auto& p : params) result.push_back(p.requires_grad() ? found[next++] : torch::Tensor());
    return result;
  }
};
}  // namespace detail

DTRAIN_INLINE torch::Tensor recompute_in_backward(const torch::nn::Module& module, std::function<torch::Tensor(const torch::Tensor&)> fn,
                                                  const torch::Tensor& x) {
  std::vector<torch::Tensor> params;
  for (const auto& p : module.parameters())
    if (p.requires_grad()) params.push_back(p);
  if (!torch::GradMode::is_enabled() || (!x.requires_grad() && params.empty())) return fn(x);

  auto state = c10::make_intrusive<detail::RecomputeState>();
  state->fn = std::move(fn);
  state->x_needs_grad = x.requires_grad();
  if (!x.device().is_cpu()) state->device = x.device();
  state->cpu_rng = detail::rng_state(c10::nullopt);
  if (state->device) state->device_rng = detail::rng_state(state->device);
  state->autocast_cpu = compat::autocast_enabled(at::kCPU);
  state->autocast_cuda = compat::autocast_enabled(at::kCUDA);
  state->autocast_cpu_dtype = compat::autocast_dtype(at::kCPU);
  state->autocast_cuda_dtype = compat::autocast_dtype(at::kCUDA);
  return detail::RecomputeFunction::apply(state, x, at::TensorList(params));
}

}  // namespace nn
DTRAIN_NAMESPACE_END
