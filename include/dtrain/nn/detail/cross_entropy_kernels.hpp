// SPDX-License-Identifier: Apache-2.0
#pragma once
// The CUDA kernels behind nn::cross_entropy_fp32 for fp16 and bf16 logits (nn/loss.hpp), as source
// compiled at run time by NVRTC: a header-only library has no .cu file of its own to compile.
//
// One block per row of the logits. Forward reads the row once (an online max and sum of exponents,
// in fp32) and writes the row's max and log of the sum; backward reads the row again and writes the
// gradient in the logits' dtype. The fp32 log-probabilities and their fp32 gradient, which
// Python's `F.cross_entropy(logits.float(), y)` writes and reads over the largest activation of a
// language model, never exist. This header needs NVRTC alone (no LibTorch), so that
// tests/cuda/nvrtc_kernels.cpp compiles the kernels on a machine without a GPU.

#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

#include <nvrtc.h>

#include <dtrain/version.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace nn::detail {

inline constexpr const char* cross_entropy_kernel_names[2] = {"dtrain_cross_entropy_forward",
                                                               "dtrain_cross_entropy_backward"};

// DTRAIN_BF16 picks bf16 bits, else fp16. Half values travel as their 16 bits: no cuda_fp16.h or
// cuda_bf16.h, which NVRTC may not find. bf16 rounds to nearest even, as c10::BFloat16 does.
inline constexpr const char* cross_entropy_kernel_source = R"CUDA(
typedef unsigned short half_bits;
#define NEG_INF __int_as_float(0xff800000)
#ifdef DTRAIN_BF16
__device__ __forceinline__ float to_float(half_bits v) { return __uint_as_float(((unsigned int)v) << 16); }
__device__ __forceinline__ half_bits from_float(float f) {
  unsigned int u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (half_bits)0x7fc0u;
  u += 0x7fffu + ((u >> 16) & 1u);
  return (half_bits)(u >> 16);
}
#else
__device__ __forceinline__ float to_float(half_bits v) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v));
  return f;
}
__device__ __forceinline__ half_bits from_float(float f) {
  half_bits h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}
#endif

// A running max m and sum s of exp(x - m). -inf adds nothing; NaN makes s NaN.
struct max_sum { float m, s; };
__device__ __forceinline__ void add(max_sum& a, float x) {
  if (x > a.m) { a.s = a.s * expf(a.m - x) + 1.0f; a.m = x; }
  else if (x != NEG_INF) a.s += expf(x - a.m);
}
__device__ __forceinline__ max_sum combine(max_sum a, max_sum b) {
  const float m = fmaxf(a.m, b.m);
  return {m, (a.m == m ? a.s : a.s * expf(a.m - m)) + (b.m == m ? b.s : b.s * expf(b.m - m))};
}
__device__ __forceinline__ max_sum warp_combine(max_sum v) {
  for (int o = 16; o > 0; o >>= 1)
    v = combine(v, max_sum{__shfl_xor_sync(0xffffffffu, v.m, o), __shfl_xor_sync(0xffffffffu, v.s, o)});
  return v;
}
// blockDim.x is a multiple of 32, at most 1024; the result is thread 0's.
__device__ max_sum block_combine(max_sum v) {
  __shared__ float ms[32], ss[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_combine(v);
  if (lane == 0) { ms[warp] = v.m; ss[warp] = v.s; }
  __syncthreads();
  if (warp == 0) {
    v = lane < (int)(blockDim.x >> 5) ? max_sum{ms[lane], ss[lane]} : max_sum{NEG_INF, 0.0f};
    v = warp_combine(v);
  }
  return v;
}

// Eight half values in 16 bytes.
__device__ __forceinline__ float element(const uint4& v, int k) {
  const unsigned int w = k < 4 ? (k < 2 ? v.x : v.y) : (k < 6 ? v.z : v.w);
  return to_float((half_bits)((k & 1) ? (w >> 16) : (w & 0xffffu)));
}

// stats[2 * row] = the row's max, stats[2 * row + 1] = log(sum(exp(x - max))); loss[row] =
// log-sum-exp minus the target's logit, 0 for an ignored row, NaN for a target outside [0, classes).
extern "C" __global__ void dtrain_cross_entropy_forward(const half_bits* __restrict__ logits,
    const long long* __restrict__ target, long long classes, long long ignore_index, int vectorized,
    float* __restrict__ stats, float* __restrict__ loss) {
  const long long row = blockIdx.x;
  const long long t = target[row];
  if (t == ignore_index) {
    if (threadIdx.x == 0) { stats[2 * row] = 0.0f; stats[2 * row + 1] = 0.0f; loss[row] = 0.0f; }
    return;
  }
  const half_bits* x = logits + row * classes;
  max_sum acc = {NEG_INF, 0.0f};
  if (vectorized) {
    const uint4* x8 = reinterpret_cast<const uint4*>(x);
    for (long long i = threadIdx.x; i < classes / 8; i += blockDim.x) {
      const uint4 v = x8[i];
#pragma unroll
      for (int k = 0; k < 8; ++k) add(acc, element(v, k));
    }
  } else {
    for (long long i = threadIdx.x; i < classes; i += blockDim.x) add(acc, to_float(x[i]));
  }
  acc = block_combine(acc);
  if (threadIdx.x == 0) {
    const float log_sum = logf(acc.s);
    stats[2 * row] = acc.m;
    stats[2 * row + 1] = log_sum;
    loss[row] = (t >= 0 && t < classes) ? log_sum - (to_float(x[t]) - acc.m) : __int_as_float(0x7fc00000);
  }
}

// grad = scale * (softmax(x) - onehot(target)) in the logits' dtype; 0 for an ignored row. *scale is
// the loss's gradient over the count of rows not ignored (a device scalar: no host sync, graph-safe).
extern "C" __global__ void dtrain_cross_entropy_backward(const half_bits* __restrict__ logits,
    const long long* __restrict__ target, long long classes, long long ignore_index, int vectorized,
    const float* __restrict__ stats, const float* __restrict__ scale, half_bits* __restrict__ grad) {
  const long long row = blockIdx.x;
  const long long t = target[row];
  const half_bits* x = logits + row * classes;
  half_bits* g = grad + row * classes;
  const bool ignored = t == ignore_index;
  const float m = ignored ? 0.0f : stats[2 * row], log_sum = ignored ? 0.0f : stats[2 * row + 1];
  const float w = ignored ? 0.0f : *scale;
  if (vectorized) {
    const uint4* x8 = reinterpret_cast<const uint4*>(x);
    uint4* g8 = reinterpret_cast<uint4*>(g);
    for (long long i = threadIdx.x; i < classes / 8; i += blockDim.x) {
      unsigned int out[4] = {0u, 0u, 0u, 0u};
      if (!ignored) {
        const uint4 v = x8[i];
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          float p = expf((element(v, k) - m) - log_sum);
          if (8 * i + k == t) p -= 1.0f;
          out[k >> 1] |= ((unsigned int)from_float(p * w)) << ((k & 1) * 16);
        }
      }
      g8[i] = make_uint4(out[0], out[1], out[2], out[3]);
    }
  } else {
    for (long long i = threadIdx.x; i < classes; i += blockDim.x) {
      float p = 0.0f;
      if (!ignored) {
        p = expf((to_float(x[i]) - m) - log_sum);
        if (i == t) p -= 1.0f;
      }
      g[i] = from_float(p * w);
    }
  }
}
)CUDA";

/// The kernels compiled for compute capability `major.minor`: a cubin when this NVRTC knows the
/// architecture, else PTX for the newest one it knows below it (the driver compiles that). Throws
/// std::runtime_error with NVRTC's log when compiling fails.
inline std::vector<char> compile_cross_entropy_kernels(int major, int minor, bool bf16) {
  auto check = [](nvrtcResult r, const char* what) {
    if (r != NVRTC_SUCCESS) throw std::runtime_error(std::string(what) + ": " + nvrtcGetErrorString(r));
  };
  int count = 0;
  check(nvrtcGetNumSupportedArchs(&count), "nvrtcGetNumSupportedArchs");
  std::vector<int> archs(static_cast<std::size_t>(count));
  check(nvrtcGetSupportedArchs(archs.data()), "nvrtcGetSupportedArchs");
  const int wanted = 10 * major + minor;
  int arch = 0;
  for (int a : archs)
    if (a <= wanted && a > arch) arch = a;
  if (arch == 0)
    throw std::runtime_error("NVRTC " + std::to_string(count) + " architectures, none at or below sm_" +
                             std::to_string(wanted));
  const bool cubin = arch == wanted;
  const std::string arch_option = std::string("--gpu-architecture=") + (cubin ? "sm_" : "compute_") +
                                  std::to_string(arch);
  std::vector<const char*> options = {arch_option.c_str(), "--std=c++17"};
  if (bf16) options.push_back("-DDTRAIN_BF16");

  nvrtcProgram program = nullptr;
  check(nvrtcCreateProgram(&program, cross_entropy_kernel_source, "dtrain_cross_entropy.cu", 0, nullptr, nullptr),
        "nvrtcCreateProgram");
  struct destroy {
    nvrtcProgram* p;
    ~destroy() { nvrtcDestroyProgram(p); }
  } destroy_program{&program};
  if (nvrtcCompileProgram(program, static_cast<int>(options.size()), options.data()) != NVRTC_SUCCESS) {
    std::size_t size = 0;
    nvrtcGetProgramLogSize(program, &size);
    std::string log(size, '\0');
    nvrtcGetProgramLog(program, log.data());
    throw std::runtime_error("NVRTC could not compile the cross-entropy kernels for " + arch_option + ":\n" + log);
  }
  std::size_t size = 0;
  std::vector<char> code;
  if (cubin) {
    check(nvrtcGetCUBINSize(program, &size), "nvrtcGetCUBINSize");
    code.resize(size);
    check(nvrtcGetCUBIN(program, code.data()), "nvrtcGetCUBIN");
  } else {
    check(nvrtcGetPTXSize(program, &size), "nvrtcGetPTXSize");
    code.resize(size);
    check(nvrtcGetPTX(program, code.data()), "nvrtcGetPTX");
  }
  return code;
}

}  // namespace nn::detail

DTRAIN_NAMESPACE_END
