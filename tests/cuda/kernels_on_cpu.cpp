// SPDX-License-Identifier: Apache-2.0
// nn::cross_entropy_fp32's CUDA kernels (bf16), run on the CPU by scripts/check-cuda: the kernel
// source, compiled as C++, with one std::thread per CUDA thread, a barrier for __syncthreads and a
// warp's barrier around each shuffle. Checks the arithmetic and the indexing (16-byte and one-value
// loads, one warp and several, ignored rows, -inf logits, a target out of range) against a double
// reference, where CI has no GPU; tests/gpu checks the compiled kernels on one.
#include <barrier>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <thread>
#include <vector>

namespace {
struct dim {
  unsigned x;
};
thread_local unsigned thread_index, block_index;
unsigned block_size;
std::vector<std::unique_ptr<std::barrier<>>> warp_barriers;
std::unique_ptr<std::barrier<>> block_barrier;
float shuffled[1024];
}  // namespace

#define threadIdx (dim{thread_index})
#define blockIdx (dim{block_index})
#define blockDim (dim{block_size})
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
struct uint4 {
  unsigned x, y, z, w;
};
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
template <class To, class From>
To bits_as(From from) {
  To to;
  std::memcpy(&to, &from, sizeof to);
  return to;
}
inline float __uint_as_float(unsigned u) { return bits_as<float>(u); }
inline float __int_as_float(int i) { return bits_as<float>(i); }
inline unsigned __float_as_uint(float f) { return bits_as<unsigned>(f); }
float __shfl_xor_sync(unsigned, float v, int offset) {
  auto& warp = *warp_barriers[thread_index / 32];
  shuffled[thread_index] = v;
  warp.arrive_and_wait();
  const float other = shuffled[thread_index ^ static_cast<unsigned>(offset)];
  warp.arrive_and_wait();
  return other;
}
void __syncthreads() { block_barrier->arrive_and_wait(); }

#define DTRAIN_BF16
#include "cross_entropy_kernels.cu"

namespace {
void launch(unsigned grid, unsigned block, const std::function<void()>& kernel) {
  block_size = block;
  for (unsigned b = 0; b < grid; ++b) {
    warp_barriers.clear();
    for (unsigned w = 0; w < block / 32; ++w) warp_barriers.push_back(std::make_unique<std::barrier<>>(32));
    block_barrier = std::make_unique<std::barrier<>>(block);
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < block; ++t)
      threads.emplace_back([&, t, b] {
        thread_index = t;
        block_index = b;
        kernel();
      });
    for (auto& t : threads) t.join();
  }
}
}  // namespace

int main() {
  std::mt19937 gen(5);
  std::normal_distribution<float> normal(0, 3);
  int failed = 0;
  for (long long classes : {64LL, 1001LL, 4096LL})
    for (int vectorized : {0, 1})
      for (unsigned block : {32u, 128u}) {
        if (vectorized && classes % 8 != 0) continue;
        const long long rows = 6, ignore = -100;
        std::vector<half_bits> x(static_cast<std::size_t>(rows * classes));
        for (auto& v : x) v = from_float(normal(gen));
        for (long long j = 0; j < 50; ++j) x[static_cast<std::size_t>(2 * classes + j)] = from_float(-INFINITY);
        const std::vector<long long> target = {3, ignore, 60, classes - 1, 0, 7};
        std::vector<float> stats(2 * rows), row_loss(rows);
        launch(rows, block, [&] {
          dtrain_cross_entropy_forward(x.data(), target.data(), classes, ignore, vectorized, stats.data(),
                                       row_loss.data());
        });
        auto at = [&](long long r, long long j) { return static_cast<double>(to_float(x[r * classes + j])); };
        double sum = 0, reference_sum = 0;
        int count = 0;
        std::vector<double> log_sum_exp(rows);
        for (long long r = 0; r < rows; ++r) {
          double m = -INFINITY, s = 0;
          for (long long j = 0; j < classes; ++j) m = std::max(m, at(r, j));
          for (long long j = 0; j < classes; ++j) s += std::exp(at(r, j) - m);
          log_sum_exp[r] = m + std::log(s);
          if (target[r] == ignore) {
            failed += row_loss[r] != 0;
            continue;
          }
          ++count;
          reference_sum += log_sum_exp[r] - at(r, target[r]);
          sum += row_loss[r];
        }
        const float scale = 1.0f / static_cast<float>(count);
        std::vector<half_bits> grad(x.size(), 0xffff);  // NaN: every value must be written
        launch(rows, block, [&] {
          dtrain_cross_entropy_backward(x.data(), target.data(), classes, ignore, vectorized, stats.data(), &scale,
                                        grad.data());
        });
        int wrong = 0;
        for (long long r = 0; r < rows; ++r)
          for (long long j = 0; j < classes; ++j) {
            const double want = target[r] == ignore ? 0 : (std::exp(at(r, j) - log_sum_exp[r]) - (j == target[r])) * scale;
            const double got = to_float(grad[r * classes + j]);
            // One bf16 rounding: 2^-8 of the value.
            if (!(std::abs(got - want) <= std::abs(want) / 128)) ++wrong;
          }
        const double error = std::abs(sum - reference_sum) / reference_sum;
        std::printf("%lld classes, %s loads, %u threads: loss relative error %.1e, %d gradient values wrong\n", classes,
                    vectorized ? "16-byte" : "one-value", block, error, wrong);
        failed += error > 1e-6 || wrong != 0;
      }
  // A target outside [0, classes): NaN, not a stopped device.
  const std::vector<half_bits> x(64, from_float(1.0f));
  const std::vector<long long> target = {64};
  std::vector<float> stats(2), row_loss(1);
  launch(1, 32, [&] { dtrain_cross_entropy_forward(x.data(), target.data(), 64, -100, 1, stats.data(), row_loss.data()); });
  std::printf("a target out of range: loss %g\n", row_loss[0]);
  failed += !std::isnan(row_loss[0]);
  std::printf("%s\n", failed ? "FAILED" : "passed");
  return failed == 0 ? 0 : 1;
}
