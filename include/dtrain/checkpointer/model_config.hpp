// SPDX-License-Identifier: Apache-2.0
#pragma once
// A model that describes itself: its construction config, saved in every checkpoint as
// model_config.json, from which a Predictor (or the user) builds the model with no sizes given.
//
//   struct NetConfig {
//     std::int64_t vocab = 0, classes = 0;
//   };
//   NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(NetConfig, vocab, classes)  // the config as JSON
//
//   struct NetImpl : torch::nn::Module {
//     using Config = NetConfig;
//     explicit NetImpl(const Config& c) : config(c) { ...build from c... }
//     Config config;  // what it was built from: ctx.checkpoint() saves it
//   };
//   TORCH_MODULE(Net);
//
//   auto net = dtrain::checkpointer::build_model<Net>(checkpoint);  // Net(config) of the checkpoint
//
// model_config.json: {"format": 1, "model": "<the module's C++ type>", "config": {...}}; a checkpoint
// of another model type is refused, naming both.

#include <concepts>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <typeinfo>

#include <nlohmann/json.hpp>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <dtrain/checkpointer/checkpoint.hpp>
#include <dtrain/checkpointer/files.hpp>
#include <dtrain/detail/type_name.hpp>
#include <dtrain/error.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace detail {
/// The module type of a model handle: a torch::nn::Module, its TORCH_MODULE holder, or a
/// shared_ptr to it.
template <class M>
struct module_of {
  using type = M;
};
template <class M>
struct module_of<torch::nn::ModuleHolder<M>> {
  using type = M;
};
template <class M>
  requires std::is_base_of_v<torch::nn::ModuleHolder<typename M::ContainedType>, M>
struct module_of<M> {
  using type = typename M::ContainedType;
};
template <class M>
struct module_of<std::shared_ptr<M>> {
  using type = M;
};
template <class M>
using module_of_t = typename module_of<std::remove_cvref_t<M>>::type;

}  // namespace detail

namespace checkpointer {

/// A module (or its handle) that says how it was built: a `Config` type that nlohmann::json
/// converts both ways (NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE), a public member `Config config`,
/// and a constructor from a `const Config&`.
template <class Model>
concept DescribedModel = requires(const dtrain::detail::module_of_t<Model>& m, nlohmann::json& j) {
  typename dtrain::detail::module_of_t<Model>::Config;
  requires std::same_as<std::remove_cvref_t<decltype(m.config)>, typename dtrain::detail::module_of_t<Model>::Config>;
  requires std::constructible_from<dtrain::detail::module_of_t<Model>, const typename dtrain::detail::module_of_t<Model>::Config&>;
  j = m.config;
  j.get<typename dtrain::detail::module_of_t<Model>::Config>();
};

/// The name a checkpoint records for `Model`'s type (its module's C++ type).
template <class Model>
std::string model_type_name() {
  return dtrain::detail::type_name<dtrain::detail::module_of_t<Model>>();
}

/// model_config.json's text for `model`: its type and its config.
template <DescribedModel Model>
std::string describe_model(const Model& model) {
  const auto& module = [&]() -> const dtrain::detail::module_of_t<Model>& {
    if constexpr (std::is_base_of_v<torch::nn::Module, Model>) return model;
    else return *model;
  }();
  return nlohmann::json{{"format", 1}, {"model", model_type_name<Model>()}, {"config", module.config}}.dump(2);
}

/// The model type and config a checkpoint was saved with, or nothing when its model does not
/// describe itself. Throws ConfigError when model_config.json is there but malformed.
struct SavedModelConfig {
  std::string model;
  nlohmann::json config;

  static std::optional<SavedModelConfig> of(const Checkpoint& checkpoint);
};

/// `Model` built from the config `checkpoint` saved (its weights are not loaded: Predictor and
/// ctx.restore do that). Throws ConfigError when the checkpoint has no model_config.json (its model
/// has no `Config config`), when it was saved from another model type (naming both), or when the
/// config does not convert to Model's Config (naming the file and the reason).
template <class Model>
Model build_model(const Checkpoint& checkpoint) {
  static_assert(DescribedModel<Model>,
                "dtrain::checkpointer::build_model<Model>: Model must describe itself: a `using Config = ...;` "
                "that nlohmann::json converts (NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(Config, fields...)), a public "
                "member `Config config;` and a constructor from `const Config&` (see checkpointer/model_config.hpp)");
  using Module = dtrain::detail::module_of_t<Model>;
  const auto saved = SavedModelConfig::of(checkpoint);
  const auto wanted = model_type_name<Model>();
  if (!saved)
    throw ConfigError("checkpoint " + checkpoint.path().string() + " does not say how its model was built (no " +
                      files::model_config + "): it was saved from a model without a `Config config;` member. Build the " +
                      wanted + " yourself and pass it, or give the model a Config and train it again");
  if (saved->model != wanted)
    throw ConfigError("checkpoint " + checkpoint.path().string() + " holds a " + saved->model + ", not a " + wanted +
                      "; load it with a Predictor (or build_model) of " + saved->model);
  typename Module::Config config;
  try {
    config = saved->config.template get<typename Module::Config>();
  } catch (const std::exception& e) {
    throw ConfigError((checkpoint.path() / files::model_config).string() + ": its config does not convert to " +
                      dtrain::detail::type_name<typename Module::Config>() + " (" + e.what() +
                      "); the Config type changed since the checkpoint was saved");
  }
  if constexpr (std::is_same_v<Model, std::shared_ptr<Module>>) return std::make_shared<Module>(config);
  else return Model(config);
}

}  // namespace checkpointer

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/checkpointer/impl/model_config.ipp>
#endif
