// SPDX-License-Identifier: Apache-2.0
#pragma once
// The Precision concept and precision_traits: the single source of truth for what a Precision
// policy provides (docs/design.md links here).

#include <concepts>
#include <cstdint>

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <dtrain/concept/archetypes.hpp>
#include <dtrain/policy/category.hpp>

DTRAIN_NAMESPACE_BEGIN

/// @concept Precision: the numeric precision of forward and backward.
///
/// Minimal complete definition
/// - `using category = dtrain::category::precision;`
/// - `static constexpr bool requires_cuda`: true when it cannot run on CPU (policy::set then
///   rejects it with a CPU backend);
/// - a nested `state`, one per worker, constructible from torch::Device, with
///   - `autocast()`: an RAII scope, autocast on while it lives;
///   - `backward(const torch::Tensor& loss)`;
///   - `bool step(Optimizer&)`: the optimizer step, false when it was skipped.
///
/// Optional members (defaults in precision_traits)
/// - a `state` constructor from (torch::Device, Communicator&) (default: the device-only one),
///   which the context prefers: amp's GradScaler agrees on overflows over ranks with it.
/// - `static constexpr bool state::loss_scaling` (default false): backward scales the loss and
///   step may skip. When true, `state::skipped_steps()` and `state::loss_scale()` are required
///   (the metrics rows report them), so they have no defaults: precision_traits reports 0 skipped
///   steps and a loss scale of 1 only for a precision without loss scaling.
///
/// Laws (tests/laws/precision.hpp)
/// - a step under precision::fp32 equals a plain `loss.backward(); opt.step();`;
/// - a skipped step (step() returned false) leaves the parameters unchanged;
/// - with loss scaling, every rank skips the same steps (the state built with a communicator).
///
/// Models: precision::fp32, precision::amp<bf16>, precision::amp<fp16>.
template <class P>
concept PrecisionPolicy = PolicyOf<P, category::precision> && std::constructible_from<typename P::state, torch::Device> &&
    requires(typename P::state& s, const torch::Tensor& loss, torch::optim::Optimizer& opt) {
      { P::requires_cuda } -> std::convertible_to<bool>;
      s.autocast();
      s.backward(loss);
      { s.step(opt) } -> std::convertible_to<bool>;
    } &&
    // Loss scaling comes with what the metrics rows report about it.
    (!requires { P::state::loss_scaling; } || !P::state::loss_scaling ||
     requires(const typename P::state& s) {
       { s.skipped_steps() } -> std::convertible_to<std::int64_t>;
       { s.loss_scale() } -> std::convertible_to<double>;
     });

/// Every optional member of a Precision, with its documented default (see PrecisionPolicy above).
/// The worker context calls these; nothing else looks for optional precision members.
template <class P>
struct precision_traits {
  using state = typename P::state;

  /// state::loss_scaling, or false.
  static constexpr bool loss_scaling = [] {
    if constexpr (requires { state::loss_scaling; }) return bool(state::loss_scaling);
    else return false;
  }();

  /// The steps s skipped so far: s.skipped_steps() under loss scaling, else 0 (no step is skipped).
  static std::int64_t skipped_steps(const state& s) {
    if constexpr (loss_scaling) return s.skipped_steps();
    else return 0;
  }

  /// The current loss scale: s.loss_scale() under loss scaling, else 1.
  static double loss_scale(const state& s) {
    if constexpr (loss_scaling) return s.loss_scale();
    else return 1.0;
  }

  /// state(device, comm) where that constructor exists, else state(device).
  template <class Communicator>
  static state make_state(torch::Device device, Communicator& comm) {
    if constexpr (std::is_constructible_v<state, torch::Device, Communicator&>) return state(device, comm);
    else return state(device);
  }
};

static_assert(PrecisionPolicy<archetype::precision>,
              "dtrain: the PrecisionPolicy concept asks for more than its minimal complete definition "
              "(archetype::precision in concept/archetypes.hpp); keep the two in step");

DTRAIN_NAMESPACE_END
