// SPDX-License-Identifier: Apache-2.0
#pragma once
// nn::cross_entropy_fp32 on CUDA fp16 and bf16 logits: the kernels of cross_entropy_kernels.hpp,
// compiled by NVRTC once per device and dtype, loaded with the CUDA runtime's library API, launched
// on the current stream (no host sync: a captured CUDA graph replays them), behind an autograd
// function. Where they cannot be compiled or loaded, the loss takes the copying form, and says why
// once on stderr.

#include <algorithm>
#include <cstdint>
#include <iostream>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <variant>

#include <cuda_runtime_api.h>

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/autograd.h>
#include <torch/types.h>

#include <dtrain/error.hpp>
#include <dtrain/nn/detail/cross_entropy_kernels.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace nn::detail {

struct cross_entropy_kernels {
  cudaKernel_t forward = nullptr;
  cudaKernel_t backward = nullptr;
};

/// The kernels for `device` and the dtype (bf16 or fp16), compiled and loaded on first use; an
/// error message instead when this machine cannot (e.g. an NVRTC that knows no architecture of the
/// device's). Thread-safe; each (device, dtype) is compiled once per process.
inline const std::variant<cross_entropy_kernels, std::string>& load_cross_entropy_kernels(int device, bool bf16) {
  static std::mutex mutex;
  static std::map<std::pair<int, bool>, std::variant<cross_entropy_kernels, std::string>> loaded;
  std::lock_guard lock(mutex);
  auto [it, inserted] = loaded.try_emplace({device, bf16});
  if (!inserted) return it->second;
  auto check = [](cudaError_t status, const char* what) {
    if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
  };
  try {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    int major = 0, minor = 0;
    check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), "cudaDeviceGetAttribute");
    check(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device), "cudaDeviceGetAttribute");
    const auto code = compile_cross_entropy_kernels(major, minor, bf16);
    cudaLibrary_t library = nullptr;  // kept for the process's life, as the kernels are
    check(cudaLibraryLoadData(&library, code.data(), nullptr, nullptr, 0, nullptr, nullptr, 0), "cudaLibraryLoadData");
    cross_entropy_kernels kernels;
    check(cudaLibraryGetKernel(&kernels.forward, library, cross_entropy_kernel_names[0]), "cudaLibraryGetKernel");
    check(cudaLibraryGetKernel(&kernels.backward, library, cross_entropy_kernel_names[1]), "cudaLibraryGetKernel");
    // Load them onto the device now, not lazily inside a stream capture.
    cudaFuncAttributes attributes{};
    check(cudaFuncGetAttributes(&attributes, reinterpret_cast<const void*>(kernels.forward)), "cudaFuncGetAttributes");
    check(cudaFuncGetAttributes(&attributes, reinterpret_cast<const void*>(kernels.backward)), "cudaFuncGetAttributes");
    it->second = kernels;
  } catch (const std::exception& e) {
    it->second = std::string(e.what());
    std::cerr << "dtrain: nn::cross_entropy_fp32 takes the copying form for " << (bf16 ? "bf16" : "fp16")
              << " logits on cuda:" << device << " (its kernels could not be loaded: " << e.what() << ")\n";
  }
  return it->second;
}

// One block per row; a multiple of 32 threads, at most 256 (16,384 rows fill an H100 many times).
inline void launch_cross_entropy_kernel(cudaKernel_t kernel, const torch::Tensor& logits, void** args) {
  const auto items = logits.size(1) % 8 == 0 ? logits.size(1) / 8 : logits.size(1);
  const auto threads = static_cast<unsigned>(std::clamp<std::int64_t>((items + 31) / 32 * 32, 32, 256));
  C10_CUDA_CHECK(cudaLaunchKernel(reinterpret_cast<const void*>(kernel), dim3(static_cast<unsigned>(logits.size(0))),
                                  dim3(threads), args, 0, c10::cuda::getCurrentCUDAStream(logits.get_device())));
}

struct fused_cross_entropy : torch::autograd::Function<fused_cross_entropy> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& logits,
                               const torch::Tensor& target, std::int64_t ignore_index,
                               const cross_entropy_kernels* kernels) {
    c10::cuda::CUDAGuard guard(logits.device());
    auto x = logits.contiguous();
    auto t = target.contiguous();
    auto stats = torch::empty({x.size(0), 2}, x.options().dtype(torch::kFloat));
    auto row_loss = torch::empty({x.size(0)}, x.options().dtype(torch::kFloat));
    const void* x_ptr = x.data_ptr();
    const void* t_ptr = t.data_ptr();
    long long classes = x.size(1), ignore = ignore_index;
    int vectorized = vectorizable(x);
    void* stats_ptr = stats.data_ptr();
    void* loss_ptr = row_loss.data_ptr();
    void* args[] = {&x_ptr, &t_ptr, &classes, &ignore, &vectorized, &stats_ptr, &loss_ptr};
    launch_cross_entropy_kernel(kernels->forward, x, args);
    auto count = t.ne(ignore_index).sum().to(torch::kFloat);
    ctx->save_for_backward({x, t, stats, count});
    ctx->saved_data["ignore_index"] = ignore_index;
    ctx->saved_data["kernel"] = reinterpret_cast<std::int64_t>(kernels->backward);
    return row_loss.sum() / count;
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grad_outputs) {
    if (torch::GradMode::is_enabled())
      throw ConfigError("nn::cross_entropy_fp32 has no second derivative for fp16/bf16 logits on CUDA: for "
                        "backward(create_graph=true) compute F::cross_entropy(logits.to(torch::kFloat), target)");
    const auto saved = ctx->get_saved_variables();
    const auto& x = saved[0];
    c10::cuda::CUDAGuard guard(x.device());
    const auto scale = (grad_outputs[0].to(torch::kFloat) / saved[3]).contiguous();
    auto grad = torch::empty_like(x, torch::MemoryFormat::Contiguous);
    const void* x_ptr = x.data_ptr();
    const void* t_ptr = saved[1].data_ptr();
    long long classes = x.size(1), ignore = ctx->saved_data["ignore_index"].toInt();
    int vectorized = vectorizable(x) && vectorizable(grad);
    const void* stats_ptr = saved[2].data_ptr();
    const void* scale_ptr = scale.data_ptr();
    void* grad_ptr = grad.data_ptr();
    void* args[] = {&x_ptr, &t_ptr, &classes, &ignore, &vectorized, &stats_ptr, &scale_ptr, &grad_ptr};
    launch_cross_entropy_kernel(reinterpret_cast<cudaKernel_t>(ctx->saved_data["kernel"].toInt()), x, args);
    return {grad, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }

  // 16-byte loads: whole rows of 8 values, from a 16-byte aligned start.
  static bool vectorizable(const torch::Tensor& x) {
    return x.size(1) % 8 == 0 && reinterpret_cast<std::uintptr_t>(x.data_ptr()) % 16 == 0;
  }
};

/// The fused loss where it applies (CUDA fp16/bf16 logits, int64 targets on the same device, the
/// kernels loaded); nullopt otherwise, for the copying form.
inline std::optional<torch::Tensor> fused_cross_entropy_fp32(const torch::Tensor& logits, const torch::Tensor& target,
                                                             std::int64_t ignore_index) {
  const auto dtype = logits.scalar_type();
  if (!logits.is_cuda() || (dtype != torch::kHalf && dtype != torch::kBFloat16) ||
      target.scalar_type() != torch::kLong || target.device() != logits.device() || logits.size(0) == 0 ||
      logits.size(0) > std::numeric_limits<int>::max() || logits.size(1) == 0)
    return std::nullopt;
  const auto& loaded = load_cross_entropy_kernels(logits.get_device(), dtype == torch::kBFloat16);
  const auto* kernels = std::get_if<cross_entropy_kernels>(&loaded);
  if (kernels == nullptr) return std::nullopt;
  return fused_cross_entropy::apply(logits, target, ignore_index, kernels);
}

}  // namespace nn::detail

DTRAIN_NAMESPACE_END
