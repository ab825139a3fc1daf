// SPDX-License-Identifier: Apache-2.0
#pragma once
// precision::GradScaler: dynamic loss scaling for mixed precision, as torch.amp.GradScaler does it.

#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ops/_amp_foreach_non_finite_check_and_unscale.h>
#include <ATen/ops/_amp_update_scale.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <torch/types.h>

#include <dtrain/error.hpp>
#include <dtrain/precision/optimizer_step.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace precision {

/// GradScaler's tunables; the defaults are PyTorch's.
struct GradScalerOptions {
  /// The first scale: 2^16.
  double init_scale = 65536.0;
  /// The scale is multiplied by this after `growth_interval` steps in a row without inf or NaN.
  double growth_factor = 2.0;
  /// ... and by this after a step whose gradients held an inf or NaN (the step is skipped).
  double backoff_factor = 0.5;
  std::int64_t growth_interval = 2000;

  void validate() const;
};

/// Dynamic loss scaling. backward() goes through scale(loss), so that small fp16 gradients do not
/// flush to zero; step(optimizer) divides the gradients by the scale, and
/// - when any gradient holds an inf or NaN (on any rank: `agree` takes the maximum over ranks) it
///   skips the optimizer step, multiplies the scale by backoff_factor and counts the skip;
/// - otherwise it steps, and after growth_interval such steps in a row multiplies the scale by
///   growth_factor.
/// Every rank agrees on whether a step was skipped, so the ranks' scales and parameters stay equal.
///
/// On CUDA the work is ATen's fused kernels (_amp_foreach_non_finite_check_and_unscale_,
/// _amp_update_scale_), with no host synchronisation but the one that decides the skip. LibTorch
/// 1.13 has no CPU kernels for them, so on CPU an equivalent composite of isfinite/mul_ runs.
class GradScaler {
 public:
  /// Takes the maximum of a one-element float tensor over every rank, in place. Empty: one rank.
  using agree_fn = std::function<void(torch::Tensor& found_inf)>;

  explicit GradScaler(torch::Device device, GradScalerOptions options = {}, agree_fn agree = {});

  /// `loss` times the current scale; call backward() on that.
  torch::Tensor scale(const torch::Tensor& loss) const { return loss * scale_; }

  /// Divides the gradients of `opt`'s parameters by the scale, in place, once per step (call it
  /// before clipping gradients; step() then does not divide again). Returns true when one of them
  /// held an inf or NaN on some rank.
  template <class Optimizer>
  bool unscale(Optimizer& opt) {
    if (unscaled_) return found_;
    std::vector<torch::Tensor> grads;
    for (auto& group : opt.param_groups())
      for (auto& p : group.params())
        if (p.grad().defined()) grads.push_back(p.mutable_grad());
    found_ = unscale_grads(grads);
    unscaled_ = true;
    return found_;
  }

  /// Unscales (unless unscale() did), then steps `opt` unless a gradient held an inf or NaN on
  /// some rank, and updates the scale. Returns false when the step was skipped.
  template <class Optimizer>
  bool step(Optimizer& opt) {
    const bool inf = unscale(opt);
    if (inf) ++skipped_;
    else optimizer_step(opt);
    update(inf);
    unscaled_ = false;
    return !inf;
  }

  /// Divides `grads` by the scale in place and reports whether any held an inf or NaN, agreed over
  /// ranks. For step() and unscale(); public for tests and custom loops (then call update()).
  bool unscale_grads(std::vector<torch::Tensor>& grads);

  /// Backs the scale off after an overflow, or grows it after growth_interval clean steps.
  void update(bool found_inf);

  /// The current scale (host copy).
  double scale_value() const { return scale_value_; }
  /// The scale tensor the loss is multiplied by (on the device).
  const torch::Tensor& scale_tensor() const { return scale_; }
  /// Clean steps since the last growth or backoff.
  std::int64_t growth_tracker() const { return clean_steps_; }
  /// Optimizer steps skipped because a gradient held an inf or NaN.
  std::int64_t skipped_steps() const { return skipped_; }
  const GradScalerOptions& options() const { return options_; }

  /// The state a resumed run needs to scale as the saved one would have: the scale, the clean
  /// steps since its last change, and the skipped steps (the options come from the code).
  void save(torch::serialize::OutputArchive& archive) const;
  void load(torch::serialize::InputArchive& archive);

 private:
  GradScalerOptions options_;
  agree_fn agree_;
  torch::Device device_;
  torch::Tensor scale_, found_inf_, growth_tracker_;
  double scale_value_;
  std::int64_t clean_steps_ = 0, skipped_ = 0;
  bool unscaled_ = false, found_ = false;
};

}  // namespace precision

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/precision/impl/grad_scaler.ipp>
#endif
