// SPDX-License-Identifier: Apache-2.0
#pragma once
// PreparedModels: the models ctx.prepare_model() wrapped, each with its Strategy state, and the
// calls the context routes through them.

#include <concepts>
#include <cstddef>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/types.h>

#include <dtrain/error.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace detail {

/// A module handle prepare_model() accepts: a torch::nn::ModuleHolder (TORCH_MODULE(Net), Sequential)
/// or a std::shared_ptr to a torch::nn::Module.
template <class M>
concept ModuleHandle = requires(M m) {
  { *m } -> std::convertible_to<torch::nn::Module&>;
  m->to(torch::Device(torch::kCPU));
};

/// The torch::nn::Module behind a module, its holder or a shared_ptr to one.
template <class M>
torch::nn::Module& as_module(const M& m) {
  if constexpr (std::is_base_of_v<torch::nn::Module, M>) return const_cast<M&>(m);
  else return const_cast<torch::nn::Module&>(static_cast<const torch::nn::Module&>(*m));
}

}  // namespace detail

/// The Strategy states of the prepared models, in preparation order.
template <class StrategyState>
class PreparedModels {
 public:
  /// Wraps `m` with a new Strategy state built from (m, args...).
  template <class... Args>
  StrategyState& add(torch::nn::Module& m, Args&... args) {
    states_.push_back(std::make_unique<StrategyState>(m, args...));
    modules_.push_back(&m);
    return *states_.back();
  }

  std::size_t size() const { return states_.size(); }
  const StrategyState& at(std::size_t i) const { return *states_.at(i); }

  /// The state of a model prepare_model() returned, or nullptr for any other.
  template <class M>
  StrategyState* find(const M& model) const {
    const torch::nn::Module* m = &detail::as_module(model);
    for (std::size_t i = 0; i < modules_.size(); ++i)
      if (modules_[i] == m) return states_[i].get();
    return nullptr;
  }
  /// The state of a model prepare_model() returned; ConfigError naming `call` for any other.
  template <class M>
  StrategyState& of(const M& model, const char* call) const {
    if (auto* s = find(model)) return *s;
    throw ConfigError(std::string(call) + ": this model was not prepared by this context; pass the handle "
                      "returned by ctx.prepare_model(...)");
  }

  template <class F>
  void for_each(F&& f) {
    for (auto& s : states_) f(*s);
  }

  /// Whether `opt` is new since the last call (another optimizer, or its parameter groups changed):
  /// checks on optimizers then run once per optimizer, not every step.
  template <class Optimizer>
  bool first_sight(const Optimizer& opt) {
    const std::pair<const void*, std::size_t> seen{&opt, opt.param_groups().size()};
    if (seen == last_optimizer_) return false;
    last_optimizer_ = seen;
    return true;
  }

 private:
  std::vector<std::unique_ptr<StrategyState>> states_;
  std::vector<const torch::nn::Module*> modules_;  // the module of each states_ entry
  std::pair<const void*, std::size_t> last_optimizer_{nullptr, 0};
};

DTRAIN_NAMESPACE_END
