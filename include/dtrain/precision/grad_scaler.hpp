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

  void validate() const {
    if (!(init_scale > 0) || !std::isfinite(init_scale))
      throw ConfigError("GradScalerOptions::init_scale is " + std::to_string(init_scale) + "; it must be positive and finite");
    if (!(growth_factor > 1))
      throw ConfigError("GradScalerOptions::growth_factor is " + std::to_string(growth_factor) + "; it must be > 1");
    if (!(backoff_factor > 0 && backoff_factor < 1))
      throw ConfigError("GradScalerOptions::backoff_factor is " + std::to_string(backoff_factor) + "; it must be in (0, 1)");
    if (growth_interval < 1)
      throw ConfigError("GradScalerOptions::growth_interval is " + std::to_string(growth_interval) + "; it must be >= 1");
  }
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

  explicit GradScaler(torch::Device device, GradScalerOptions options = {}, agree_fn agree = {})
      : options_(options), agree_(std::move(agree)), device_(device), scale_value_(options.init_scale) {
    options_.validate();
    const auto f = torch::TensorOptions().device(device).dtype(torch::kFloat);
    scale_ = torch::full({1}, options_.init_scale, f);
    found_inf_ = torch::zeros({1}, f);
    growth_tracker_ = torch::zeros({1}, f.dtype(torch::kInt));
  }

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
  bool unscale_grads(std::vector<torch::Tensor>& grads) {
    torch::NoGradGuard no_grad;
    found_inf_.zero_();
    const auto inv_scale = scale_.to(torch::kDouble).reciprocal().to(torch::kFloat);
    if (device_.is_cuda()) {
      // The fused kernel wants one dtype per call.
      std::map<torch::ScalarType, std::vector<torch::Tensor>> by_dtype;
      for (auto& g : grads) by_dtype[g.scalar_type()].push_back(g);
      for (auto& [dtype, list] : by_dtype) at::_amp_foreach_non_finite_check_and_unscale_(list, found_inf_, inv_scale);
    } else {
      for (auto& g : grads) {
        found_inf_.copy_(torch::maximum(found_inf_, torch::isfinite(g).logical_not().any().to(torch::kFloat).reshape({1})));
        g.mul_(inv_scale.to(g.scalar_type()));
      }
    }
    if (agree_) agree_(found_inf_);
    return found_inf_.item<float>() > 0;
  }

  /// Backs the scale off after an overflow, or grows it after growth_interval clean steps.
  void update(bool found_inf) {
    torch::NoGradGuard no_grad;
    if (device_.is_cuda()) {
      // found_inf_ is the agreed flag unscale_grads() left on the device; the host mirror below
      // follows the same rule, so scale() needs no synchronisation.
      at::_amp_update_scale_(scale_, growth_tracker_, found_inf_, options_.growth_factor, options_.backoff_factor,
                             options_.growth_interval);
    }
    if (found_inf) {
      scale_value_ *= options_.backoff_factor;
      clean_steps_ = 0;
    } else if (++clean_steps_ == options_.growth_interval) {
      // As ATen's kernel: a growth that would overflow fp32 keeps the scale.
      if (std::isfinite(static_cast<float>(scale_value_ * options_.growth_factor))) scale_value_ *= options_.growth_factor;
      clean_steps_ = 0;
    }
    if (!device_.is_cuda()) {
      scale_.fill_(scale_value_);
      growth_tracker_.fill_(clean_steps_);
    }
  }

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
  void save(torch::serialize::OutputArchive& archive) const {
    archive.write("scale", torch::tensor(scale_value_, torch::kDouble));
    archive.write("growth_tracker", torch::tensor(clean_steps_, torch::kLong));
    archive.write("skipped_steps", torch::tensor(skipped_, torch::kLong));
  }
  void load(torch::serialize::InputArchive& archive) {
    torch::Tensor scale, tracker, skipped;
    archive.read("scale", scale);
    archive.read("growth_tracker", tracker);
    archive.read("skipped_steps", skipped);
    const double value = scale.item<double>();
    const auto clean = tracker.item<std::int64_t>();
    if (!(value > 0) || !std::isfinite(value) || clean < 0 || skipped.item<std::int64_t>() < 0)
      throw Error("GradScaler::load: a saved scale of " + std::to_string(value) + ", growth tracker " +
                  std::to_string(clean) + " and skipped steps " + std::to_string(skipped.item<std::int64_t>()) +
                  " are not a GradScaler's state (the scale must be positive and finite, the counts >= 0)");
    scale_value_ = value;
    clean_steps_ = clean;
    skipped_ = skipped.item<std::int64_t>();
    scale_.fill_(scale_value_);
    growth_tracker_.fill_(clean_steps_);
  }

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
