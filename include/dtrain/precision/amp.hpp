#pragma once
// precision::amp<bf16>: automatic mixed precision through ATen's autocast.

#include <type_traits>

#include <ATen/autocast_mode.h>
#include <torch/types.h>

#include <dtrain/error.hpp>
#include <dtrain/policy/category.hpp>
#include <dtrain/precision/fp32.hpp>

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

namespace detail {
// LibTorch 1.13 spells autocast per device type (set_cpu_enabled, set_autocast_cpu_dtype); 2.x
// takes the device type as an argument. This is the one place that knows.
inline bool cpu_autocast_enabled() {
#if defined(TORCH_VERSION_MAJOR) && TORCH_VERSION_MAJOR >= 2 && TORCH_VERSION_MINOR >= 4
  return at::autocast::is_autocast_enabled(at::kCPU);
#else
  return at::autocast::is_cpu_enabled();
#endif
}
inline at::ScalarType cpu_autocast_dtype() {
#if defined(TORCH_VERSION_MAJOR) && TORCH_VERSION_MAJOR >= 2 && TORCH_VERSION_MINOR >= 4
  return at::autocast::get_autocast_dtype(at::kCPU);
#else
  return at::autocast::get_autocast_cpu_dtype();
#endif
}
inline void set_cpu_autocast(bool enabled, at::ScalarType dtype) {
#if defined(TORCH_VERSION_MAJOR) && TORCH_VERSION_MAJOR >= 2 && TORCH_VERSION_MINOR >= 4
  at::autocast::set_autocast_enabled(at::kCPU, enabled);
  at::autocast::set_autocast_dtype(at::kCPU, dtype);
#else
  at::autocast::set_cpu_enabled(enabled);
  at::autocast::set_autocast_cpu_dtype(dtype);
#endif
}
}  // namespace detail

/// Autocast to `Half` (bf16 or fp16) inside ctx.autocast() scopes; parameters, gradients and the
/// optimizer stay in fp32. bf16 has fp32's exponent range, so it needs no loss scaling.
/// amp<fp16> needs CUDA (CPU autocast in LibTorch has no fp16) and dynamic loss scaling, which
/// arrive with backend::nccl; with a CPU backend it is rejected at compile time.
template <class Half>
struct amp {
  static_assert(std::is_same_v<Half, bf16> || std::is_same_v<Half, fp16>,
                "precision::amp<T>: T must be precision::bf16 or precision::fp16");
  using category = dtrain::category::precision;
  static constexpr const char* name = std::is_same_v<Half, bf16> ? "amp_bf16" : "amp_fp16";
  static constexpr bool requires_cuda = std::is_same_v<Half, fp16>;
  using half = Half;

  /// backward() and step() are fp32's: bf16 needs no loss scaling.
  struct state : fp32::state {
    explicit state(torch::Device device) : fp32::state(device) {
      if (!device.is_cpu())
        throw ConfigError("precision::amp<bf16> on " + device.str() +
                          ": this build autocasts on CPU only; CUDA autocast comes with backend::nccl");
    }

    /// Autocast on while it lives; the previous autocast state comes back when it ends.
    class scope {
     public:
      scope() : was_enabled_(detail::cpu_autocast_enabled()), was_dtype_(detail::cpu_autocast_dtype()) {
        detail::set_cpu_autocast(true, Half::dtype);
        at::autocast::increment_nesting();
      }
      scope(const scope&) = delete;
      scope& operator=(const scope&) = delete;
      ~scope() {
        // Casts are cached within the outermost scope only; drop them when it closes.
        if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
        detail::set_cpu_autocast(was_enabled_, was_dtype_);
      }

     private:
      bool was_enabled_;
      at::ScalarType was_dtype_;
    };

    scope autocast() const { return {}; }
  };
};

}  // namespace precision

DTRAIN_NAMESPACE_END
