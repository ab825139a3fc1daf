// SPDX-License-Identifier: Apache-2.0
// GPU tests: built only when LibTorch has CUDA and NCCL is found (tests/gpu/CMakeLists.txt); run on
// a GPU machine (docs/gpu.md has the recipe). Each needs one visible CUDA device.

#include "../dtrain_catch.hpp"

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <thread>
#include <tuple>
#include <variant>
#include <vector>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/torch.h>

// idx.hpp first: its namespace data::detail must not hide dtrain::detail from prefetch.hpp's CUDA
// transfer (it did, and only a CUDA build of a file including both in this order failed).
#include <dtrain/data/idx.hpp>
#include <dtrain/all.hpp>

namespace {

namespace d = dtrain;
using amp16 = d::precision::amp<d::precision::fp16>;

const torch::Device gpu(torch::kCUDA, 0);

d::launch::WorkerIdentity one_rank() {
  d::launch::WorkerIdentity who;
  who.rank = 0;
  who.world_size = 1;
  return who;
}

torch::nn::Sequential mlp() {
  torch::manual_seed(11);
  using namespace torch::nn;
  return Sequential(Linear(64, 256), ReLU(), Linear(256, 256), ReLU(), Linear(256, 10));
}

std::vector<torch::Tensor> snapshot(const torch::nn::Sequential& m) {
  std::vector<torch::Tensor> v;
  for (const auto& p : m->parameters()) v.push_back(p.detach().clone());
  return v;
}

}  // namespace

TEST_CASE("a CUDA device is visible, and the NCCL loaded is the one nccl.h describes", "[gpu]") {
  REQUIRE(torch::cuda::is_available());
  REQUIRE(DTRAIN_WITH_CUDA);
  // CMake must link NCCL_ROOT's library, not another libnccl of a different version on the system.
  int loaded = 0;
  REQUIRE(ncclGetVersion(&loaded) == ncclSuccess);
  CHECK(loaded == NCCL_VERSION_CODE);
}

TEST_CASE("backend::nccl at world size 1: every collective, on the communication stream", "[gpu][nccl]") {
  auto store = c10::make_intrusive<c10d::HashStore>();
  d::backend::nccl::communicator comm(store, one_rank(), std::chrono::seconds(30));
  CHECK(comm.size() == 1);
  CHECK(comm.device() == gpu);
  CHECK(comm.stream() != c10::cuda::getCurrentCUDAStream(0));

  auto t = torch::arange(1000, torch::TensorOptions().device(gpu).dtype(torch::kFloat));
  const auto expected = t.clone();
  for (auto op : {d::reduce::sum, d::reduce::mean, d::reduce::max, d::reduce::min}) {
    auto w = comm.allreduce(t, op);
    w.wait();  // the current stream now runs after the allreduce
    CHECK(torch::equal(t, expected));
  }
  auto h = torch::ones({7}, torch::TensorOptions().device(gpu).dtype(torch::kHalf));
  comm.allreduce(h, d::reduce::sum).wait();
  CHECK(h.sum().item<float>() == 7);
  comm.broadcast(t, 0).wait();
  CHECK(torch::equal(t, expected));
  auto full = torch::empty_like(t);
  comm.allgather(full, t).wait();
  CHECK(torch::equal(full, expected));
  auto shard = torch::empty_like(t);
  comm.reduce_scatter(shard, full, d::reduce::sum).wait();
  CHECK(torch::equal(shard, expected));
  comm.barrier();

  // Bad input: CPU tensors and mismatched sizes name the fix.
  auto cpu = torch::ones({3});
  CHECK_THROWS_WITH(comm.allreduce(cpu), Catch::Contains("collectives take tensors on cuda:0"));
  auto small = torch::empty({3}, t.options());
  CHECK_THROWS_WITH(comm.allgather(small, t), Catch::Contains("world size x shard"));
}

TEST_CASE("the communication stream waits for the compute stream's kernels", "[gpu][nccl]") {
  auto store = c10::make_intrusive<c10d::HashStore>();
  d::backend::nccl::communicator comm(store, one_rank(), std::chrono::seconds(30));
  // A long chain of kernels produces t on the compute stream; the allreduce must see the result.
  auto x = torch::randn({2048, 2048}, torch::TensorOptions().device(gpu));
  auto t = x;
  for (int i = 0; i < 20; ++i) t = torch::tanh(t.matmul(x) / 2048.0);
  const auto expected = t.clone();
  comm.allreduce(t, d::reduce::sum).wait();
  CHECK(torch::equal(t, expected));
}

TEST_CASE("the watchdog aborts a collective past the timeout and the error names it", "[gpu][nccl]") {
  using namespace std::chrono_literals;
  auto store = c10::make_intrusive<c10d::HashStore>();
  d::backend::nccl::communicator comm(store, one_rank(), 3000ms);
  // A host function holds the compute stream, so the allreduce, ordered after it, cannot start: to
  // the watchdog that is a collective whose peers never come.
  static std::atomic<bool> release{false};
  release = false;
  auto t = torch::ones({1024}, torch::TensorOptions().device(gpu));
  auto u = torch::ones({4}, torch::TensorOptions().device(gpu));
  const auto compute = c10::cuda::getCurrentCUDAStream(0);
  REQUIRE(cudaLaunchHostFunc(
              compute.stream(),
              [](void*) {
                const auto until = std::chrono::steady_clock::now() + 30s;
                while (!release && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(1ms);
              },
              nullptr) == cudaSuccess);
  auto stalled = comm.allreduce(t, d::reduce::sum);
  // Before the timeout the communicator still works (the next collective queues behind).
  std::this_thread::sleep_for(1500ms);
  CHECK_NOTHROW(comm.allreduce(u, d::reduce::sum));
  // The watchdog polls every 100 ms: by 4.5 s it has aborted the communicator. wait() (which
  // does not block the host: completion is stream-ordered) then throws the collective's error.
  std::this_thread::sleep_for(3000ms);
  std::string error;
  try {
    stalled.wait();
  } catch (const d::WorkerError& e) {
    error = e.what();
  }
  release = true;
  compute.synchronize();  // the host function returns; the aborted collectives' stream is left alone
  CHECK_THAT(error, Catch::Contains("allreduce of 1024 values on rank 0 did not complete within 3000 ms") &&
                        Catch::Contains("collective_timeout"));
  // Every later call fails the same way instead of hanging on the aborted communicator.
  CHECK_THROWS_WITH(comm.allreduce(u), Catch::Contains("allreduce of 1024 values"));
  CHECK_THROWS_WITH(comm.barrier(), Catch::Contains("did not complete within 3000 ms"));
}

TEST_CASE("amp<fp16>: autocast on the GPU, and a step within tolerance of fp32's", "[gpu][amp]") {
  auto fp32_model = mlp(), amp_model = mlp(), unscaled_model = mlp();
  fp32_model->to(gpu);
  amp_model->to(gpu);
  unscaled_model->to(gpu);
  const auto x = torch::randn({128, 64}, torch::TensorOptions().device(gpu));
  const auto y = torch::randint(0, 10, {128}, torch::TensorOptions().device(gpu).dtype(torch::kLong));

  torch::optim::SGD sgd32(fp32_model->parameters(), 0.5), sgd16(amp_model->parameters(), 0.5),
      sgd_unscaled(unscaled_model->parameters(), 0.5);
  torch::nn::functional::cross_entropy(fp32_model->forward(x), y).backward();
  sgd32.step();

  amp16::state state(gpu);
  torch::Tensor logits;
  {
    auto scope = state.autocast();
    logits = amp_model->forward(x);
    CHECK(logits.scalar_type() == torch::kHalf);
  }
  state.backward(torch::nn::functional::cross_entropy(logits.to(torch::kFloat), y));
  CHECK(state.step(sgd16));
  CHECK(state.skipped_steps() == 0);
  {
    // The same fp16 forward and backward without loss scaling: scaling by 2^16 is exact, so the
    // scaled, unscaled step must land on the same update.
    auto scope = state.autocast();
    torch::nn::functional::cross_entropy(unscaled_model->forward(x).to(torch::kFloat), y).backward();
  }
  sgd_unscaled.step();
  const auto a = snapshot(fp32_model), b = snapshot(amp_model), c = snapshot(unscaled_model), before = snapshot(mlp());
  auto rel = [](const torch::Tensor& got, const torch::Tensor& want) {
    return ((got - want).norm() / want.norm().clamp_min(1e-12)).item<double>();
  };
  for (std::size_t i = 0; i < a.size(); ++i) {
    CHECK(b[i].scalar_type() == torch::kFloat);  // parameters stay fp32
    // The update (not the weights, which barely move).
    const auto du32 = a[i] - before[i].to(gpu), du16 = b[i] - before[i].to(gpu), du_unscaled = c[i] - before[i].to(gpu);
    INFO("parameter " << i << ": update vs fp32's " << rel(du16, du32) << ", vs unscaled fp16's " << rel(du16, du_unscaled));
    CHECK(rel(du16, du_unscaled) < 1e-3);
    // Against fp32: fp16 rounding flips the ReLU masks of pre-activations within ~1e-3 of zero
    // (about 0.1 % of them here), and each flip moves a whole gradient term: measured 2.1-2.2 % on
    // an H100 for the first layer. A wrong scale or a missing unscale is off by a factor.
    CHECK(rel(du16, du32) < 5e-2);
  }
}

TEST_CASE("amp<fp16>: an overflow skips the step and backs the scale off (fused kernels)", "[gpu][amp]") {
  auto model = mlp();
  model->to(gpu);
  torch::optim::SGD sgd(model->parameters(), 0.1);
  amp16::state state(gpu);
  const auto x = torch::randn({32, 64}, torch::TensorOptions().device(gpu));
  torch::Tensor loss;
  {
    auto scope = state.autocast();
    loss = model->forward(x).to(torch::kFloat).pow(2).mean();
  }
  state.backward(loss);
  model->parameters()[2].mutable_grad()[3][4] = std::numeric_limits<float>::infinity();
  const auto before = snapshot(model);
  CHECK_FALSE(state.step(sgd));
  const auto after = snapshot(model);
  for (std::size_t i = 0; i < before.size(); ++i) CHECK(torch::equal(before[i], after[i]));
  CHECK(state.skipped_steps() == 1);
  CHECK(state.loss_scale() == 32768.0);
  CHECK(state.scaler()->scale_tensor().item<double>() == 32768.0);  // _amp_update_scale_ agrees
}

TEST_CASE("GradScaler: the fused CUDA path and the CPU composite agree", "[gpu][amp]") {
  for (bool overflow : {false, true}) {
    auto g = torch::randn({1000}) * 65536;
    if (overflow) g[17] = std::numeric_limits<float>::quiet_NaN();
    d::precision::GradScaler on_gpu(gpu), on_cpu(torch::kCPU);
    std::vector<torch::Tensor> gg{g.to(gpu)}, gc{g.clone()};
    CHECK(on_gpu.unscale_grads(gg) == overflow);
    CHECK(on_cpu.unscale_grads(gc) == overflow);
    if (!overflow) CHECK(torch::allclose(gg[0].cpu(), gc[0]));
    on_gpu.update(overflow);
    on_cpu.update(overflow);
    CHECK(on_gpu.scale_tensor().item<double>() == on_cpu.scale_tensor().item<double>());
  }
}

TEST_CASE("the prefetcher hands out the same batches, on the device", "[gpu][prefetch]") {
  auto ds = d::data::TensorDataset(torch::randn({100, 8}), torch::arange(100));
  std::vector<d::data::Batch> batches;
  for (int b = 0; b < 10; ++b) batches.push_back(ds.get_batch(torch::arange(b * 10, b * 10 + 10)));
  int i = 0;
  for (const auto& b : d::data::prefetch(batches, d::data::cuda_transfer(gpu))) {
    CHECK(b.data.device() == gpu);
    CHECK(torch::equal(b.data.cpu(), batches[i].data));
    CHECK(torch::equal(b.target.cpu(), batches[i].target));
    ++i;
  }
  CHECK(i == 10);
}

TEST_CASE("nn::cross_entropy_fp32 on fp16 and bf16 logits: F.cross_entropy(logits.float())'s values, without fp32 copies",
          "[gpu][nn]") {
  // The kernels compile and load on this GPU: otherwise the loss would quietly take the copying form.
#if DTRAIN_FUSED_CROSS_ENTROPY
  for (bool bf16 : {false, true}) {
    const auto& loaded = d::nn::detail::load_cross_entropy_kernels(0, bf16);
    INFO((std::holds_alternative<std::string>(loaded) ? std::get<std::string>(loaded) : "loaded"));
    REQUIRE(std::holds_alternative<d::nn::detail::cross_entropy_kernels>(loaded));
  }
#else
  FAIL("built without DTRAIN_WITH_NVRTC (CMake found no NVRTC of CUDA 12 or later): the loss copies");
#endif
  // Forward and backward; the loss, the gradient and the allocator's peak.
  auto run = [&](const torch::Tensor& values, auto loss_of) {
    auto logits = values.clone().requires_grad_();
    c10::cuda::device_synchronize();
    c10::cuda::CUDACachingAllocator::resetPeakStats(0);
    const auto before = c10::cuda::CUDACachingAllocator::getDeviceStats(0).allocated_bytes[0].current;
    auto loss = loss_of(logits);
    loss.backward();
    c10::cuda::device_synchronize();
    const auto peak = c10::cuda::CUDACachingAllocator::getDeviceStats(0).allocated_bytes[0].peak - before;
    return std::tuple{loss.detach(), logits.grad(), peak};
  };
  // 8192 classes take the kernels' 16-byte loads, 1001 their one-value loads.
  for (const std::int64_t classes : {8192, 1001}) {
    torch::manual_seed(12);
    const std::int64_t n = 2048;
    auto target = torch::randint(100, classes, {n}, torch::TensorOptions().device(gpu).dtype(torch::kLong));
    target.narrow(0, 0, 16).fill_(-100);
    auto values = torch::randn({n, classes}, gpu) * 3;
    values.narrow(0, 16, 16).narrow(1, 0, 100).fill_(-std::numeric_limits<float>::infinity());  // masked classes
    auto ours = [&](const torch::Tensor& x) { return d::nn::cross_entropy_fp32(x, target); };
    auto copying = [&](const torch::Tensor& x) {
      return torch::nn::functional::cross_entropy(x.to(torch::kFloat), target);
    };
    for (const auto dtype : {torch::kHalf, torch::kBFloat16}) {
      INFO(classes << " classes, " << dtype);
      const auto half = values.to(dtype);
      const auto [loss, grad, peak] = run(half, ours);
      const auto [reference, reference_grad, reference_peak] = run(half, copying);
      CHECK(loss.scalar_type() == torch::kFloat);
      CHECK(std::isfinite(loss.item<double>()));
      CHECK(std::abs(loss.item<double>() - reference.item<double>()) <= 1e-5 * std::abs(reference.item<double>()));
      REQUIRE(grad.scalar_type() == dtype);
      // Within one rounding of the dtype (fp16 11 bits, bf16 8): the two sum the row in different orders.
      const double rtol = dtype == torch::kHalf ? 1.0 / 512 : 1.0 / 128;
      CHECK(torch::allclose(grad.to(torch::kFloat), reference_grad.to(torch::kFloat), rtol, /*atol=*/1e-7));
      CHECK(grad.narrow(0, 0, 16).abs().sum().item<double>() == 0);  // ignored rows
      CHECK(grad.narrow(0, 16, 16).narrow(1, 0, 100).abs().sum().item<double>() == 0);  // masked classes
      // No fp32 copy or log-probabilities forward, no fp32 gradient backward: at least 4 bytes a logit
      // less at the peak.
      CHECK(peak + 4 * n * classes <= reference_peak);
    }
  }
  // A target outside [0, classes) gives a NaN loss (ATen's kernel would stop the device with an assert).
  const auto logits = torch::randn({4, 64}, gpu).to(torch::kBFloat16);
  const auto target = torch::tensor({1, 2, 64, 3}, torch::TensorOptions().device(gpu).dtype(torch::kLong));
  CHECK(std::isnan(d::nn::cross_entropy_fp32(logits, target).item<double>()));
}
