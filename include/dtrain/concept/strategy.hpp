// SPDX-License-Identifier: Apache-2.0
#pragma once
// The Strategy concept and strategy_traits: the single source of truth for what a Strategy policy
// provides (docs/design.md links here).

#include <concepts>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/types.h>

#include <dtrain/checkpointer/checkpoint.hpp>
#include <dtrain/checkpointer/snapshot_buffers.hpp>
#include <dtrain/concept/archetypes.hpp>
#include <dtrain/detail/memory.hpp>
#include <dtrain/error.hpp>
#include <dtrain/policy/category.hpp>

DTRAIN_NAMESPACE_BEGIN

/// @concept Strategy: how a model is wrapped and its gradients synchronised.
///
/// Minimal complete definition
/// - `using category = dtrain::category::strategy;`
/// - a nested `template <class Communicator> class state`, one per prepared model, constructible
///   from (torch::nn::Module&, Communicator&), written against the Backend concept's communicator
///   only (it is checked with archetype::communicator), with
///   - `void set_sync(bool)`: false while ctx.no_sync() lives (backward then issues no collective).
///
/// Optional members (defaults in strategy_traits)
/// - `static constexpr bool shards_optimizer` (default false): the optimizer steps this rank's
///   shards, so each rank checkpoints its own optimizer state.
/// - `static constexpr bool reshards_optimizer` (default false): with shards_optimizer, a run of
///   another worker count loads the saved shards through
///   `state::load_resharded_optimizer(optimizer, files)` (one file per saved rank, rank order);
///   without it such a resume, and an elastic range, is a ConfigError.
/// - `state::parameters()` (default: the module's parameters): what the optimizer steps.
/// - `state::forward(f)` (default: `f()`): runs the model's forward `f` (gathering around it).
/// - `state::full_state()` (default: the module's parameters and buffers by name, cloned, on rank
///   0; empty elsewhere): a collective that every rank calls; the checkpoint's model.pt.
/// - `state::load_full_state(tensors, source)` (default: not handled, and the checkpoint copies
///   the tensors into the module by name): loads a model.pt's tensors into the wrapped model.
/// - `state::held_bytes()` (default: the module's parameters and gradients): bytes of model state
///   this rank holds now, optimizer state excluded.
/// - `state::check_optimizer(params)` (default: any optimizer is fine): throws ConfigError when
///   an optimizer over `params` cannot train the wrapped model.
///
/// Laws (tests/laws/strategy.hpp)
/// - N workers train as 1 worker does (the same parameters after the same steps, within 1e-5);
/// - after a synchronised backward every rank holds the same gradients (under fsdp<>: the same
///   full gradient, each rank its shard of it);
/// - under set_sync(false) backward issues no collective;
/// - every rank issues the same collectives in the same order.
///
/// Models: strategy::ddp<>, strategy::fsdp<>.
template <class S>
concept StrategyPolicy = PolicyOf<S, category::strategy> &&
    std::constructible_from<typename S::template state<archetype::communicator>, torch::nn::Module&,
                            archetype::communicator&> &&
    requires(typename S::template state<archetype::communicator>& s) { s.set_sync(true); };

/// Every optional member of a Strategy, with its documented default (see StrategyPolicy above).
/// The worker context calls these; nothing else looks for optional strategy members. `State` is
/// `S::state<Communicator>`.
template <class S>
struct strategy_traits {
  /// S::shards_optimizer, or false.
  static constexpr bool shards_optimizer = [] {
    if constexpr (requires { S::shards_optimizer; }) return bool(S::shards_optimizer);
    else return false;
  }();

  /// S::reshards_optimizer, or false.
  static constexpr bool reshards_optimizer = [] {
    if constexpr (requires { S::reshards_optimizer; }) return bool(S::reshards_optimizer);
    else return false;
  }();

  /// s.load_resharded_optimizer(optimizer, ck's sharded optimizer files), the optimizer state that
  /// ck's ranks saved re-cut for this world; ConfigError naming the count it needs for a Strategy
  /// that cannot re-shard.
  template <class State, class Optimizer>
  static void load_resharded_optimizer(State& s, Optimizer& optimizer, const checkpointer::Checkpoint& ck, int world) {
    if constexpr (reshards_optimizer) {
      s.load_resharded_optimizer(optimizer, ck.sharded_optimizer_files());
    } else {
      throw ConfigError(ck.path().string() + " was written by " + std::to_string(ck.world_size()) +
                        " workers; the Strategy shards its optimizer state over them and cannot re-shard it, and "
                        "this run has " + std::to_string(world) + ". Resume it with ScalingConfig::num_workers = " +
                        std::to_string(ck.world_size()) + ", or restore the weights only with ctx.restore(ck, model) "
                        "and let the optimizer start afresh");
    }
  }

  /// The tensors to build the optimizer over: s.parameters(), or the module's trainable parameters.
  template <class State>
  static std::vector<torch::Tensor> parameters(State& s, const torch::nn::Module& module) {
    if constexpr (requires { s.parameters(); }) return s.parameters();
    else {
      // What trains: frozen parameters (a LoRA base, a frozen backbone) get no gradient nor state.
      std::vector<torch::Tensor> trainable;
      for (const auto& p : module.parameters())
        if (p.requires_grad()) trainable.push_back(p);
      return trainable;
    }
  }

  /// s.forward(f), or f(): the model's forward through the strategy.
  template <class State, class F>
  static decltype(auto) forward(State& s, F&& f) {
    if constexpr (requires { s.forward(f); }) return s.forward(std::forward<F>(f));
    else return std::forward<F>(f)();
  }

  /// s.full_state(), or whole_state(module, rank, into). Every rank calls it (a collective under
  /// fsdp<>).
  template <class State>
  static c10::Dict<std::string, at::Tensor> full_state(State& s, const torch::nn::Module& module, int rank,
                                                        checkpointer::detail::SnapshotBuffers* into = nullptr) {
    if constexpr (requires { s.full_state(); }) return s.full_state();
    else return whole_state(module, rank, into);
  }
  /// A whole module's parameters and buffers by name on rank 0, an empty dictionary elsewhere:
  /// clones, or copies into the previous snapshot's buffers `into` (a checkpoint).
  static c10::Dict<std::string, at::Tensor> whole_state(const torch::nn::Module& module, int rank,
                                                         checkpointer::detail::SnapshotBuffers* into = nullptr) {
    if (rank != 0) return c10::Dict<std::string, at::Tensor>();
    return into ? into->model_state(module) : checkpointer::detail::named_state(module, true);
  }

  /// s.load_full_state(tensors, source) and true, or false: the strategy leaves the model's
  /// parameters whole, so the checkpoint copies the tensors into the module itself.
  template <class State>
  static bool load_full_state(State& s, const std::map<std::string, torch::Tensor>& tensors,
                              const std::string& source) {
    if constexpr (requires { s.load_full_state(tensors, source); }) {
      s.load_full_state(tensors, source);
      return true;
    } else {
      return false;
    }
  }

  /// s.held_bytes(), or the bytes of the module's parameters and gradients.
  template <class State>
  static std::int64_t held_bytes(const State& s, const torch::nn::Module& module) {
    if constexpr (requires { s.held_bytes(); }) {
      return s.held_bytes();
    } else {
      std::int64_t n = 0;
      for (const auto& p : module.parameters()) n += detail::bytes_of(p) + detail::bytes_of(p.grad());
      return n;
    }
  }

  /// s.check_optimizer(params), or nothing: the optimizer may step any tensors.
  template <class State>
  static void check_optimizer(const State& s, const std::vector<torch::Tensor>& params) {
    if constexpr (requires { s.check_optimizer(params); }) s.check_optimizer(params);
  }
};

static_assert(StrategyPolicy<archetype::strategy>,
              "dtrain: the StrategyPolicy concept asks for more than its minimal complete definition "
              "(archetype::strategy in concept/archetypes.hpp); keep the two in step");

DTRAIN_NAMESPACE_END
