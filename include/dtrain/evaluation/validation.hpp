// SPDX-License-Identifier: Apache-2.0
#pragma once
// evaluation::validate: a classification split's loss and accuracy over all ranks, the same on any
// worker count, and safe under strategy::fsdp<> (whose forward is a collective).

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include <torch/nn/functional/loss.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <dtrain/collective.hpp>
#include <dtrain/data/dataset.hpp>
#include <dtrain/data/fields.hpp>
#include <dtrain/error.hpp>
#include <dtrain/evaluation/classification.hpp>
#include <dtrain/sampler/sequential.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace evaluation {

/// What the step of a validation gives for one batch: the model's scores [B, C] and the true
/// classes [B].
struct Scored {
  torch::Tensor logits, targets;
};

/// The validation of a split: mean cross-entropy loss and accuracy over every sample, and the
/// sample count.
struct Validation {
  double loss = 0, accuracy = 0;
  std::int64_t samples = 0;
};

/// Runs `step(batch)` (which calls ctx.forward and returns a Scored) over every sample of `data`
/// once, split over the ranks with sampler::sequential, under NoGradGuard; sums the per-sample
/// losses, the correct predictions and the samples in float64 on each rank and all-reduces the
/// sums (not per-rank means, which are biased when shards differ in size), so every rank gets the
/// numbers of one process over the whole split. `cm`, when given, is updated and summed too.
/// (Up to the forward's own rounding: a BLAS may round one sample's logits differently in a batch
/// of another size, as OpenBLAS's AVX-512 sgemm kernels do by an ulp.)
///
/// Equal collective counts: a rank with fewer batches than the largest shard runs `step` on a
/// filler batch (the split's first sample) whose result is discarded, so under strategy::fsdp<>,
/// where each forward gathers parameters from every rank, no rank waits for a forward that never
/// comes. Call it on every rank.
template <class Context, data::RandomAccess Dataset, class Step>
Validation validate(Context& ctx, const Dataset& data, std::int64_t global_batch, Step&& step,
                    ConfusionMatrix* cm = nullptr) {
  const int world = ctx.world_size();
  if (global_batch < world || global_batch % world != 0)
    throw ConfigError("validate: global batch " + std::to_string(global_batch) + " is not a multiple of the " +
                      std::to_string(world) + " workers; choose a multiple of the worker count");
  const std::int64_t per_rank = global_batch / world, n = static_cast<std::int64_t>(data.size());
  // Every rank computes every rank's batch count: no collective is needed to agree on the maximum.
  std::int64_t most = 0;
  for (int r = 0; r < world; ++r)
    most = std::max(most, (sampler::sequential::samples_per_rank(n, world, r) + per_rank - 1) / per_rank);

  torch::NoGradGuard no_grad;
  double loss_sum = 0, correct = 0, count = 0;
  auto score = [&](const Scored& s) {
    const auto targets = s.targets.to(torch::kCPU).to(torch::kInt64);
    const auto logits = s.logits.to(torch::kCPU).to(torch::kFloat32);
    const auto losses = torch::nn::functional::cross_entropy(
        logits, targets, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone));
    loss_sum += losses.to(torch::kFloat64).sum().template item<double>();
    correct += static_cast<double>(logits.argmax(1).eq(targets).sum().template item<std::int64_t>());
    count += static_cast<double>(targets.numel());
    if (cm) cm->update(logits, targets);
  };
  std::int64_t done = 0;
  for (const auto& batch : ctx.shard(data, global_batch, sampler::sequential{})) {
    score(step(batch));
    ++done;
  }
  if (done < most) {
    const auto filler = data.get_batch(torch::zeros({std::min<std::int64_t>(n, 1)}, torch::kInt64));
    for (; done < most; ++done) (void)step(filler);
  }
  // ctx.all_reduce sums in float64 on the backend's device.
  loss_sum = ctx.all_reduce(loss_sum, reduce::sum);
  correct = ctx.all_reduce(correct, reduce::sum);
  count = ctx.all_reduce(count, reduce::sum);
  if (cm) ctx.all_reduce(*cm);
  Validation v;
  v.samples = static_cast<std::int64_t>(count);
  if (v.samples > 0) {
    v.loss = loss_sum / count;
    v.accuracy = correct / count;
  }
  return v;
}

}  // namespace evaluation

DTRAIN_NAMESPACE_END
