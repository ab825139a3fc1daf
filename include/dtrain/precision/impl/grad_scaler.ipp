// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of grad_scaler.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/precision/grad_scaler.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace precision {

DTRAIN_INLINE void GradScalerOptions::validate() const {
  if (!(init_scale > 0) || !std::isfinite(init_scale))
    throw ConfigError("GradScalerOptions::init_scale is " + std::to_string(init_scale) + "; it must be positive and finite");
  if (!(growth_factor > 1))
    throw ConfigError("GradScalerOptions::growth_factor is " + std::to_string(growth_factor) + "; it must be > 1");
  if (!(backoff_factor > 0 && backoff_factor < 1))
    throw ConfigError("GradScalerOptions::backoff_factor is " + std::to_string(backoff_factor) + "; it must be in (0, 1)");
  if (growth_interval < 1)
    throw ConfigError("GradScalerOptions::growth_interval is " + std::to_string(growth_interval) + "; it must be >= 1");
}

DTRAIN_INLINE GradScaler::GradScaler(torch::Device device, GradScalerOptions options, agree_fn agree)
    : options_(options), agree_(std::move(agree)), device_(device), scale_value_(options.init_scale) {
  options_.validate();
  const auto f = torch::TensorOptions().device(device).dtype(torch::kFloat);
  scale_ = torch::full({1}, options_.init_scale, f);
  found_inf_ = torch::zeros({1}, f);
  growth_tracker_ = torch::zeros({1}, f.dtype(torch::kInt));
}

DTRAIN_INLINE bool GradScaler::unscale_grads(std::vector<torch::Tensor>& grads) {
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

DTRAIN_INLINE void GradScaler::update(bool found_inf) {
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

DTRAIN_INLINE void GradScaler::save(torch::serialize::OutputArchive& archive) const {
  archive.write("scale", torch::tensor(scale_value_, torch::kDouble));
  archive.write("growth_tracker", torch::tensor(clean_steps_, torch::kLong));
  archive.write("skipped_steps", torch::tensor(skipped_, torch::kLong));
}

DTRAIN_INLINE void GradScaler::load(torch::serialize::InputArchive& archive) {
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
}  // namespace precision
DTRAIN_NAMESPACE_END
