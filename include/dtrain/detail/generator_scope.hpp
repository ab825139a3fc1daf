// SPDX-License-Identifier: Apache-2.0
#pragma once
// GeneratorScope: while one is alive, random operators that this thread runs without a generator
// draw from the scope's own generator instead of LibTorch's default one.
//
// Why: code that dtrain runs for the user off the training step (a map_batches stage's constructor,
// which initialises a model, and its calls, on loader threads) would otherwise draw from the
// process-global default CPU generator, the one the training step's dropout draws from, at times
// no run repeats: the run's result would depend on thread timing, and a resumed run would differ
// from an uninterrupted one.
//
// How: a scope includes one dispatch key in this thread's dispatch state (c10's thread-local
// included set). On that key dtrain registers, for every operator that takes a `Generator?`, a
// boxed kernel that fills the argument, when left empty, with the scope's generator and
// redispatches below the key; every other operator falls through (costs nothing). The
// key is DispatchKey::DeferredInit, an out-of-tree key that LibTorch reserves for deferred module
// initialisation (torchdistx) and does not use itself. So:
// - The default generator is never read nor written by what runs in the scope: no swap of its
//   state, no lock held over it; the training thread, which never has the key included, draws from
//   it meanwhile unchanged.
// - The key and the scope's generator are thread-local: scopes on several loader threads at once
//   each draw from their own generator.
// - Operators on a CUDA tensor get a CUDA generator seeded alike (in a CUDA build).
// What is not covered: torch::manual_seed() called inside the scope (it reseeds the default
// generator, as it says); work the scope hands to other threads; kernels that take no generator
// and draw from the default one themselves (CUDA's fused dropout, native_dropout on a CUDA tensor:
// a stage that trains a model with dropout on the GPU; on the CPU dropout calls bernoulli_, which is
// covered); operators registered after the
// first scope or prepare() (LibTorch's own are all registered by then).
// Registering changes LibTorch's dispatch tables: prepare() does it, before loader threads start.

#include <cstdint>

#include <ATen/core/Generator.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <dtrain/version.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace detail {

class GeneratorScope {
 public:
  /// Random operators on this thread draw from generators seeded with `seed` (one per device)
  /// until the scope ends. Scopes nest: the inner one wins until it ends.
  explicit GeneratorScope(std::uint64_t seed);
  /// Random operators on the CPU draw from `cpu` itself (a CPU generator that this thread alone
  /// uses meanwhile), those on a CUDA device from one seeded with its seed.
  explicit GeneratorScope(at::Generator cpu);
  ~GeneratorScope();
  GeneratorScope(const GeneratorScope&) = delete;
  GeneratorScope& operator=(const GeneratorScope&) = delete;

  /// Registers the fallback (a scope's constructor does it too): call it before loader threads
  /// start, so that they find it registered. Throws Error when another library took the key.
  static void prepare();

  /// The generator that a random operator on `device` draws from while this scope is the
  /// innermost (created on first use).
  at::Generator& generator(c10::Device device);

 private:
  std::uint64_t seed_;
  at::Generator cpu_;
  at::Generator cuda_;
  c10::DeviceIndex cuda_index_ = -1;
  GeneratorScope* outer_ = nullptr;
  c10::impl::IncludeDispatchKeyGuard include_;
};

}  // namespace detail

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/detail/impl/generator_scope.ipp>
#endif
