// SPDX-License-Identifier: Apache-2.0
#pragma once
// precision::amp<bf16>, amp<fp16>: automatic mixed precision through ATen's autocast, with dynamic
// loss scaling (GradScaler) where it is needed.

#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include <torch/cuda.h>
#include <torch/types.h>

#include <dtrain/collective.hpp>
#include <dtrain/detail/cuda.hpp>
#include <dtrain/detail/torch_compat.hpp>
#include <dtrain/error.hpp>
#include <dtrain/policy/category.hpp>
#include <dtrain/precision/fp32.hpp>
#include <dtrain/precision/grad_scaler.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace precision {

/// The reduced-precision types amp<> takes.
struct bf16 {
  static constexpr auto dtype = torch::kBFloat16;
  static constexpr const char* name = "bf16";
};
struct fp16 {
  static constexpr auto dtype = torch::kHalf;
  static constexpr const char* name = "fp16";
};


/// No loss scaling: bf16's default (bf16 has fp32's exponent range, so gradients do not underflow).
struct no_loss_scale {
  static constexpr bool enabled = false;
  static constexpr GradScalerOptions options{};
};
/// Dynamic loss scaling with GradScaler's defaults: init 2^16, x2 after 2000 clean steps, x0.5 and
/// a skipped step after an inf or NaN. fp16's default. A struct of your own with `enabled = true`
/// and other `options` tunes it.
struct dynamic_loss_scale {
  static constexpr bool enabled = true;
  static constexpr GradScalerOptions options{};
};

/// Autocast to `Half` (bf16 or fp16) inside ctx.autocast() scopes; parameters, gradients and the
/// optimizer stay in fp32. `LossScale` is dynamic_loss_scale for fp16 and no_loss_scale for bf16
/// unless given.
///
/// On CUDA (backend::nccl) both autocast to the device. On CPU, bf16 autocasts where LibTorch does
/// (1.13 and later); amp<fp16> is rejected at compile time with a CPU backend, since fp16 without
/// a GPU gains nothing and LibTorch 1.13 cannot autocast CPU code to fp16.
template <class Half, class LossScale = std::conditional_t<std::is_same_v<Half, fp16>, dynamic_loss_scale, no_loss_scale>>
struct amp {
  static_assert(std::is_same_v<Half, bf16> || std::is_same_v<Half, fp16>,
                "precision::amp<T>: T must be precision::bf16 or precision::fp16");
  static_assert(requires { bool(LossScale::enabled); GradScalerOptions(LossScale::options); },
                "precision::amp<Half, LossScale>: LossScale must be precision::no_loss_scale, "
                "precision::dynamic_loss_scale, or a struct with `static constexpr bool enabled` and "
                "`static constexpr GradScalerOptions options`");
  using category = dtrain::category::precision;
  static constexpr const char* name = std::is_same_v<Half, bf16> ? "amp_bf16" : "amp_fp16";
  static constexpr bool requires_cuda = std::is_same_v<Half, fp16>;
  using half = Half;
  using loss_scale = LossScale;

  /// Per-worker state: the autocast scope, and the GradScaler when LossScale is enabled.
  class state {
   public:
    /// Whether backward() scales the loss and step() may skip (the context then reports
    /// `skipped_steps` and `loss_scale` in every metrics row).
    static constexpr bool loss_scaling = LossScale::enabled;

    /// One rank: found-inf needs no agreement.
    explicit state(torch::Device device) : device_(check(device)) {
      if constexpr (loss_scaling) scaler_.emplace(device_, LossScale::options);
    }
    /// Every rank of `comm`'s group skips a step when any rank's gradients overflowed.
    template <class Communicator>
    state(torch::Device device, Communicator& comm) : device_(check(device)) {
      if constexpr (loss_scaling) {
        GradScaler::agree_fn agree;
        if (comm.size() > 1) agree = [&comm](torch::Tensor& found_inf) { comm.allreduce(found_inf, reduce::max).wait(); };
        scaler_.emplace(device_, LossScale::options, std::move(agree));
      }
    }

    /// Autocast on while it lives; the previous autocast state comes back when it ends.
    class scope {
     public:
      explicit scope(at::DeviceType type)
          : type_(type), was_enabled_(compat::autocast_enabled(type)), was_dtype_(compat::autocast_dtype(type)) {
        compat::set_autocast(type_, true, Half::dtype);
        at::autocast::increment_nesting();
      }
      scope(const scope&) = delete;
      scope& operator=(const scope&) = delete;
      ~scope() {
        // Casts are cached within the outermost scope only; drop them when it closes.
        if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
        compat::set_autocast(type_, was_enabled_, was_dtype_);
      }

     private:
      at::DeviceType type_;
      bool was_enabled_;
      at::ScalarType was_dtype_;
    };

    scope autocast() const { return scope(device_.type()); }

    void backward(const torch::Tensor& loss) {
      if constexpr (loss_scaling) scaler_->scale(loss).backward();
      else loss.backward();
    }

    /// The optimizer step; under loss scaling skipped (false) when a gradient overflowed.
    template <class Optimizer>
    bool step(Optimizer& opt) {
      if constexpr (loss_scaling) {
        return scaler_->step(opt);
      } else {
        optimizer_step(opt);
        return true;
      }
    }

    /// Steps skipped for an inf or NaN gradient (0 without loss scaling).
    std::int64_t skipped_steps() const { return scaler_ ? scaler_->skipped_steps() : 0; }
    /// The current loss scale (1 without loss scaling).
    double loss_scale() const { return scaler_ ? scaler_->scale_value() : 1.0; }
    /// The GradScaler, or null without loss scaling (for unscale() before gradient clipping).
    GradScaler* scaler() { return scaler_ ? &*scaler_ : nullptr; }
    /// The GradScaler's state, for checkpoints (ctx.checkpoint saves it, ctx.restore loads it).
    void save(torch::serialize::OutputArchive& archive) const requires loss_scaling { scaler_->save(archive); }
    void load(torch::serialize::InputArchive& archive) requires loss_scaling { scaler_->load(archive); }

   private:
    static torch::Device check(torch::Device device) {
      if (device.is_cuda() && !torch::cuda::is_available())
        throw ConfigError(std::string("precision::") + name + " on " + device.str() +
                          ": this LibTorch has no CUDA (or no GPU is visible); autocast on CPU with "
                          "backend::gloo, or build against a LibTorch with CUDA and use backend::nccl");
      if (!device.is_cuda() && !device.is_cpu())
        throw ConfigError(std::string("precision::") + name + " on " + device.str() +
                          ": dtrain autocasts on CPU and CUDA devices only");
      if (device.is_cpu() && std::is_same_v<Half, fp16> && !compat::cpu_autocasts_fp16)
        throw ConfigError("precision::amp<fp16> on CPU: LibTorch " TORCH_VERSION
                          " autocasts CPU code to bf16 only; use precision::amp<bf16> on CPU, or "
                          "amp<fp16> with backend::nccl on a GPU");
      return device;
    }

    torch::Device device_;
    std::optional<GradScaler> scaler_;
  };
};

}  // namespace precision

DTRAIN_NAMESPACE_END
