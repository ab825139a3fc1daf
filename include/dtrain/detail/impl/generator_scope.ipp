// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of generator_scope.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <map>
#include <mutex>
#include <string>
#include <utility>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/jit_type.h>
#include <torch/library.h>

#include <dtrain/detail/cuda.hpp>
#include <dtrain/detail/generator_scope.hpp>
#include <dtrain/error.hpp>

#if DTRAIN_WITH_CUDA
#include <ATen/cuda/CUDAGeneratorImpl.h>
#endif

DTRAIN_NAMESPACE_BEGIN

namespace detail {

namespace generator_scope_detail {

constexpr auto kKey = c10::DispatchKey::DeferredInit;

// The innermost scope on this thread (null outside every scope).
inline GeneratorScope*& current() {
  thread_local GeneratorScope* scope = nullptr;
  return scope;
}

inline bool is_optional_generator(const c10::TypePtr& type) {
  if (type->kind() != c10::TypeKind::OptionalType) return false;
  return type->castRaw<c10::OptionalType>()->getElementType()->kind() == c10::TypeKind::GeneratorType;
}

// The device an operator runs on: its first tensor argument's, else its `device` argument's, else the CPU.
inline c10::Device device_of(const torch::jit::Stack& stack, std::size_t from) {
  for (auto k = from; k < stack.size(); ++k)
    if (stack[k].isTensor() && stack[k].toTensor().defined()) return stack[k].toTensor().device();
  for (auto k = from; k < stack.size(); ++k)
    if (stack[k].isDevice()) return stack[k].toDevice();
  return c10::Device(c10::kCPU);
}

// Each random operator on a thread inside a scope passes here: empty `Generator?` arguments get the
// scope's generator, then the operator runs as it would have below this key.
inline void fill_generators(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const auto& args = op.schema().arguments();
  if (auto* scope = current()) {
    const auto from = stack->size() - args.size();
    for (std::size_t k = 0; k < args.size(); ++k)
      if (is_optional_generator(args[k].type()) && (*stack)[from + k].isNone())
        (*stack)[from + k] = c10::IValue(scope->generator(device_of(*stack, from)));
  }
  op.redispatchBoxed(keys & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kKey), stack);
}

inline bool takes_generator(const c10::FunctionSchema& schema) {
  for (const auto& a : schema.arguments())
    if (is_optional_generator(a.type())) return true;
  return false;
}

// A fallthrough for every operator (a scope costs the others nothing: the dispatcher skips the key)
// and fill_generators for each that takes a `Generator?` (LibTorch's random operators, those that
// the composite ones such as randn or dropout call), once per process.
inline void register_fallback() {
  static std::once_flag once;
  std::call_once(once, [] {
    auto& dispatcher = c10::Dispatcher::singleton();
    if (dispatcher.hasBackendFallbackForDispatchKey(kKey))
      throw Error(
          "dtrain: the dispatch key DeferredInit already has a fallback in this process (torchdistx's deferred "
          "initialisation, or a second copy of dtrain's code in another shared library): dtrain needs it to give "
          "pipeline stages generators of their own; link dtrain into one library of the program, and do not "
          "combine it with torchdistx");
    // Never destroyed: the registrations stay until the process ends.
    auto* all = new torch::Library(torch::Library::IMPL, "_", kKey, __FILE__, __LINE__);
    all->fallback(torch::CppFunction::makeFallthrough());
    std::map<std::string, torch::Library*> by_namespace;
    for (const auto& name : dispatcher.getAllOpNames()) {
      const auto op = dispatcher.findSchema(name);
      const auto colons = name.name.find("::");
      if (!op || colons == std::string::npos || !takes_generator(op->schema())) continue;
      auto*& library = by_namespace[name.name.substr(0, colons)];
      if (!library) library = new torch::Library(torch::Library::IMPL, name.name.substr(0, colons), kKey, __FILE__, __LINE__);
      const auto full = name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
      library->impl(full.c_str(), torch::CppFunction::makeFromBoxedFunction<&fill_generators>());
    }
  });
}

}  // namespace generator_scope_detail

DTRAIN_INLINE GeneratorScope::GeneratorScope(std::uint64_t seed)
    : seed_((generator_scope_detail::register_fallback(), seed)),
      cpu_(at::detail::createCPUGenerator(seed)),
      outer_(generator_scope_detail::current()),
      include_(generator_scope_detail::kKey) {
  generator_scope_detail::current() = this;
}

DTRAIN_INLINE GeneratorScope::GeneratorScope(at::Generator cpu)
    : seed_((generator_scope_detail::register_fallback(), cpu.current_seed())),
      cpu_(std::move(cpu)),
      outer_(generator_scope_detail::current()),
      include_(generator_scope_detail::kKey) {
  generator_scope_detail::current() = this;
}

DTRAIN_INLINE void GeneratorScope::prepare() { generator_scope_detail::register_fallback(); }

DTRAIN_INLINE GeneratorScope::~GeneratorScope() { generator_scope_detail::current() = outer_; }

DTRAIN_INLINE at::Generator& GeneratorScope::generator(c10::Device device) {
  if (device.is_cpu()) return cpu_;
#if DTRAIN_WITH_CUDA
  if (device.is_cuda()) {
    const auto index = device.has_index() ? device.index() : c10::DeviceIndex(0);
    if (!cuda_.defined() || cuda_index_ != index) {
      cuda_ = at::cuda::detail::createCUDAGenerator(index);
      cuda_.set_current_seed(seed_);
      cuda_index_ = index;
    }
    return cuda_;
  }
#endif
  throw Error("dtrain: a random operator on " + device.str() +
              " ran inside a pipeline stage (a map_batches stage's constructor or call), where dtrain gives random "
              "operators generators of their own, and dtrain has none for that device: draw on the CPU there, "
              "then move the result");
}

}  // namespace detail

DTRAIN_NAMESPACE_END
