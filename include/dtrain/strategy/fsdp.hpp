// SPDX-License-Identifier: Apache-2.0
#pragma once
// strategy::fsdp<>: fully sharded data parallelism. Parameters, gradients and optimizer state are
// split 1/N over the ranks; full parameters exist only around forward and backward.

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include <torch/csrc/autograd/grad_mode.h>
#include <torch/nn/module.h>
#include <torch/types.h>

#include <dtrain/collective.hpp>
#include <dtrain/detail/buffer_sync.hpp>
#include <dtrain/error.hpp>
#include <dtrain/policy/category.hpp>
#include <dtrain/strategy/assignment.hpp>
#include <dtrain/strategy/detail/flat_storage.hpp>
#include <dtrain/strategy/detail/fsdp_full_state.hpp>
#include <dtrain/strategy/detail/fsdp_grad_views.hpp>
#include <dtrain/strategy/detail/fsdp_reshard.hpp>
#include <dtrain/strategy/detail/gradient_hooks.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace strategy {

/// When full parameters are freed (PyTorch's ShardingStrategy of the same names).
enum class sharding {
  /// Freed after forward, gathered again when backward reaches the model, freed after backward:
  /// least memory, two allgathers per step.
  full_shard,
  /// Kept from forward through backward, freed after backward: one allgather per step.
  shard_grad_op,
};

/// What the sharded model did so far: for tests and per-step breakdowns.
struct FsdpStats {
  int units = 0;
  /// Values added to pad each unit to a multiple of the world size (all units, one rank's copy).
  std::int64_t padding = 0;
  std::int64_t allgathers = 0, reduce_scatters = 0, synced_steps = 0;
  /// Seconds spent waiting for allgathers (forward, and backward under full_shard) and for the
  /// reduce-scatters at the end of backward.
  double allgather_wait_s = 0, reduce_scatter_wait_s = 0;
};


/// Fully sharded data parallel, as PyTorch's FullyShardedDataParallel does it (FSDP 1: flat
/// parameters), driven from the worker context because LibTorch's C++ modules have no forward hooks.
///
/// - At prepare_model: rank 0's parameters and buffers are broadcast; the parameters that require
///   grad are grouped into units (`Units`), each unit's parameters concatenated into one flat
///   vector, padded with zeros to a multiple of N and cut into N equal shards. Rank r keeps shard r
///   as a leaf tensor (`shards()`: what the optimizer steps, so its state is 1/N too). The model's
///   parameters become empty (shape [0]) tensors: their memory is gone.
/// - `ctx.forward(model, input)`: every unit's shards are allgathered into the unit's full flat
///   buffer and the model's parameters set to views of it; then the model runs. Under full_shard
///   the buffers are freed right after forward (the parameters go back to shape [0]), and a hook
///   on the output gathers them again when backward reaches the model. A forward whose output
///   needs no gradient (evaluation, NoGradGuard) frees them at once under either mode.
/// - Backward: each parameter's `.grad` is a view of its unit's flat (padded) gradient, allocated
///   when backward is about to start (at the end of forward under shard_grad_op, in the output's
///   hook under full_shard), so autograd accumulates straight into it. A post-hook on each
///   parameter's gradient accumulator counts it in; once a unit's gradients are all there its
///   reduce-scatter (mean over ranks) is launched, units strictly in reverse order on every rank,
///   while backward goes on. An engine callback at the end of backward waits for them, adds each
///   rank's piece to its shard's `.grad`, broadcasts rank 0's floating-point buffers (as ddp<>
///   does), and frees the full parameters and the flat gradients.
/// - Under ctx.no_sync() the full flat gradients stay and accumulate (as in PyTorch) and are
///   reduce-scattered by the next synchronised backward; the full parameters are freed as usual.
/// - What a rank holds between steps: its shards, their gradients and the optimizer's state over
///   them, i.e. 1/N of the model state (plus at most N-1 values of padding per unit), and any
///   parameters that do not require grad and the buffers, which stay whole on every rank.
template <sharding Mode = sharding::full_shard, wrap Units = wrap::top_level>
struct fsdp {
  using category = dtrain::category::strategy;
  static constexpr const char* name = "fsdp";
  static constexpr sharding mode = Mode;
  static constexpr wrap units = Units;
  /// The optimizer steps shards, so each rank checkpoints its own optimizer state; a run of
  /// another worker count re-cuts it (state::load_resharded_optimizer).
  static constexpr bool shards_optimizer = true;
  static constexpr bool reshards_optimizer = true;

  template <class Communicator>
  class state {
   public:
    state(torch::nn::Module& module, Communicator& comm) : impl_(std::make_shared<impl>(module, comm)) {
      impl_->self = impl_;
      impl_->setup();
    }
    state(const state&) = delete;
    state& operator=(const state&) = delete;
    ~state() { impl_->hooks.remove(); }

    void set_sync(bool on) { impl_->sync = on; }
    const FsdpStats& stats() const { return impl_->stats; }

    /// This rank's flat shards, one per unit: the parameters to build the optimizer over.
    std::vector<torch::Tensor> parameters() const {
      std::vector<torch::Tensor> v;
      for (const auto& u : impl_->units) v.push_back(u.shard);
      return v;
    }

    /// Runs `f` (the model's forward) with full parameters; see the class comment for when they
    /// are freed.
    template <class F>
    decltype(auto) forward(F&& f) {
      return impl_->forward(f);
    }

    /// Throws ConfigError when `params` (an optimizer's) holds any of the model's own parameters:
    /// under fsdp<> those are views that come and go, and their gradients are never kept.
    void check_optimizer(const std::vector<torch::Tensor>& params) const {
      for (const auto& p : params)
        if (auto it = impl_->index_of.find(p.unsafeGetTensorImpl()); it != impl_->index_of.end())
          throw ConfigError("strategy::fsdp<>: the optimizer was built over the model's parameters (\"" +
                            impl_->names[it->second] +
                            "\" among them), which fsdp<> replaces by this rank's flat shards; build it "
                            "over ctx.parameters(model), e.g. torch::optim::Adam opt(ctx.parameters(model), "
                            "1e-3) (that works under ddp<> too)");
    }

    /// The model's full parameters and buffers by name, gathered unit by unit: a collective that
    /// every rank calls; the tensors (clones) are returned on rank 0, the dictionary is empty
    /// elsewhere. Same names and shapes as checkpointer::detail::named_state gives under ddp<>.
    c10::Dict<std::string, at::Tensor> full_state() { return detail::full_state(*impl_); }

    /// Loads full tensors by name (a model.pt of ddp<> or fsdp<>): this rank's shard of each
    /// unit, and the unsharded parameters and buffers. Throws Error naming a missing or misshapen
    /// tensor; `source` names where they came from.
    void load_full_state(const std::map<std::string, torch::Tensor>& state, const std::string& source) {
      detail::load_full_state(*impl_, state, source);
    }

    /// Loads into `optimizer` (a torch::optim::Optimizer over parameters()) the optimizer state
    /// that the ranks of another world saved, one file per saved rank in rank order: each unit's
    /// state re-cut for this world (detail/fsdp_reshard.hpp). Throws Error naming a missing or
    /// damaged file, or a value the saved ranks disagree on.
    template <class Optimizer>
    void load_resharded_optimizer(Optimizer& optimizer, const std::vector<std::filesystem::path>& saved) {
      detail::load_resharded_optimizer(*impl_, optimizer, saved);
    }

    /// Bytes of parameters and gradients this rank holds now (shards, their gradients, anything
    /// gathered at the moment, unsharded parameters); the optimizer's state is not included.
    std::int64_t held_bytes() const { return detail::held_bytes(*impl_); }

   private:
    struct unit {
      std::vector<std::size_t> params;    // indices into impl::params
      std::vector<std::int64_t> offsets;  // where each one starts in the flat vector
      std::int64_t numel = 0, shard_numel = 0;
      torch::Tensor full;       // padded flat parameters; memory only while gathered
      torch::Tensor shard;      // this rank's piece: a leaf the optimizer steps
      torch::Tensor grad_full;  // padded flat gradient, during a synchronised backward
      torch::Tensor grad_piece;
      detail::spare_pages spare_full, spare_grad;  // their memory between steps (flat_storage.hpp)
      bool gathered = false;
      std::int64_t gathered_version = 0;  // the shard's version the full parameters came from
      int pending = 0;
      Work work;
      std::int64_t padded() const { return full.numel(); }
      std::size_t full_bytes() const { return static_cast<std::size_t>(padded()) * full.element_size(); }
    };

    struct impl {
      impl(torch::nn::Module& m, Communicator& c) : module(m), comm(c) {}
      torch::nn::Module& module;
      Communicator& comm;
      std::weak_ptr<impl> self;
      std::vector<torch::Tensor> params;
      std::vector<std::string> names;
      std::vector<std::vector<std::int64_t>> shapes;
      std::unordered_map<const c10::TensorImpl*, std::size_t> index_of;
      std::vector<std::size_t> unit_of;
      std::vector<unit> units;
      detail::gradient_hooks<impl> hooks;
      std::vector<bool> ready;
      std::size_t next_launch = 0;  // launches go units.size()-1 down to 0
      bool sync = true;
      dtrain::detail::buffer_sync buffers;
      FsdpStats stats;

      void setup() {
        detail::broadcast_state(module, comm);
        for (const auto& np : module.named_parameters(true)) {
          if (!np.value().requires_grad()) continue;
          index_of[np.value().unsafeGetTensorImpl()] = params.size();
          params.push_back(np.value());
          names.push_back(np.key());
          shapes.push_back(np.value().sizes().vec());
        }
        // Units: the root's own parameters, then each top-level child's (or all in one).
        const auto groups = unit_assignment(names, Units);
        buffers = dtrain::detail::buffer_sync(module);
        unit_of.assign(params.size(), 0);
        ready.assign(params.size(), false);
        const int world = comm.size(), rank = comm.rank();
        torch::NoGradGuard no_grad;
        for (auto& g : groups) {
          unit u;
          std::vector<std::int64_t> numels;
          for (std::size_t k : g) {
            if (params[k].scalar_type() != params[g.front()].scalar_type() || params[k].device() != params[g.front()].device())
              throw ConfigError("strategy::fsdp<>: \"" + names[k] + "\" has another dtype or device than \"" +
                                names[g.front()] + "\" in the same unit; a unit is one flat tensor. Give the model " +
                                "one dtype, or use wrap::top_level with one dtype per top-level submodule");
            unit_of[k] = units.size();
            u.params.push_back(k);
            numels.push_back(params[k].numel());
          }
          auto layout = layout_of(numels, world);
          u.offsets = std::move(layout.offsets);
          u.numel = layout.numel;
          u.shard_numel = layout.shard_numel;
          const auto& p0 = params[g.front()];
          u.full = torch::zeros({layout.padded(world)}, p0.options().requires_grad(false));
          for (std::size_t i = 0; i < u.params.size(); ++i) {
            const auto& p = params[u.params[i]];
            u.full.narrow(0, u.offsets[i], p.numel()).copy_(p.detach().reshape({-1}));
          }
          u.shard = u.full.narrow(0, rank * u.shard_numel, u.shard_numel).clone().requires_grad_(true);
          u.pending = static_cast<int>(u.params.size());
          stats.padding += layout.padded(world) - u.numel;
          units.push_back(std::move(u));
        }
        stats.units = static_cast<int>(units.size());
        // The accumulators are taken while the parameters still have their shapes: autograd
        // checks each gradient against the shape its accumulator was made for.
        hooks.install(self, params);
        for (auto& p : params) p.mutable_grad().reset();
        for (auto& u : units) {
          u.gathered = true;  // u.full holds the full parameters: reshard frees it
          reshard(u);
        }
      }

      void set_views(unit& u) {
        for (std::size_t i = 0; i < u.params.size(); ++i) {
          const auto k = u.params[i];
          params[k].set_data(u.full.narrow(0, u.offsets[i], numel_of(k)).view(shapes[k]));
        }
      }
      std::int64_t numel_of(std::size_t k) const {
        std::int64_t n = 1;
        for (auto s : shapes[k]) n *= s;
        return n;
      }

      bool current(const unit& u) const { return u.gathered && u.gathered_version == u.shard._version(); }

      // Allgathers every unit whose full parameters are absent or older than its shard: all
      // launched first, then awaited in order.
      void gather_all() {
        std::vector<unit*> todo;
        torch::NoGradGuard no_grad;
        for (auto& u : units) {
          if (current(u)) continue;
          if (!u.gathered) detail::allocate_storage(u.full, u.full_bytes(), u.spare_full);
          u.work = comm.allgather(u.full, u.shard.detach());
          ++stats.allgathers;
          todo.push_back(&u);
        }
        const auto t0 = std::chrono::steady_clock::now();
        for (auto* u : todo) {
          u->work.wait();
          u->gathered = true;
          u->gathered_version = u->shard._version();
          set_views(*u);
        }
        stats.allgather_wait_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      }

      void reshard(unit& u) {
        if (!u.gathered) return;
        for (std::size_t k : u.params) params[k].set_data(torch::empty({0}, params[k].options()));
        detail::free_storage(u.full, u.spare_full);
        u.gathered = false;
      }
      void reshard_all() {
        for (auto& u : units) reshard(u);
      }

      template <class F>
      auto forward(F& f) {
        gather_all();
        auto out = f();
        bool needs_backward = torch::autograd::GradMode::is_enabled();
        if constexpr (std::is_same_v<std::decay_t<decltype(out)>, torch::Tensor>) {
          needs_backward = needs_backward && out.requires_grad();
          if (needs_backward && Mode == sharding::full_shard && !out.is_leaf()) {
            std::weak_ptr<impl> weak = self;
            out.register_hook([weak](const torch::Tensor&) {
              if (auto me = weak.lock()) {
                me->hooks.queue_finish();
                me->gather_all();
                detail::prepare_grads(*me);
              }
            });
            reshard_all();
            return out;
          }
        }
        // Other outputs (tuples...) under full_shard keep the parameters through backward.
        if (needs_backward) detail::prepare_grads(*this);
        else reshard_all();
        return out;
      }

      void on_grad_ready(std::size_t k) {
        hooks.queue_finish();
        if (!sync || ready[k]) return;
        ready[k] = true;
        torch::NoGradGuard no_grad;
        detail::take_grad(*this, k);
        launch_ready();
      }

      void launch_ready() {
        while (next_launch < units.size()) {
          auto& u = units[units.size() - 1 - next_launch];
          if (u.pending > 0) break;
          detail::ensure_grad_full(u);
          // The reduce-scatter uses the flat gradient as scratch: the aliases go first.
          for (std::size_t k : u.params) params[k].mutable_grad().reset();
          u.grad_piece = torch::empty({u.shard_numel}, u.grad_full.options());
          u.work = comm.reduce_scatter(u.grad_piece, u.grad_full, reduce::mean);
          ++stats.reduce_scatters;
          ++next_launch;
        }
      }

      void finish_backward() {
        torch::NoGradGuard no_grad;
        if (sync) {
          // Parameters that took no part in this backward contribute zeros (or what no_sync
          // accumulated), so every rank issues every unit's reduce-scatter in the same order.
          for (std::size_t k = 0; k < params.size(); ++k)
            if (!ready[k]) {
              ready[k] = true;
              detail::take_grad(*this, k);
            }
          launch_ready();
          stats.reduce_scatter_wait_s += detail::wait_for_gradients(units, &unit::work, buffers, comm);
          for (auto& u : units) {
            auto& g = u.shard.mutable_grad();
            if (g.defined()) g.add_(u.grad_piece);
            else g = u.grad_piece;
            u.grad_piece = torch::Tensor();
            // Kept for the next backward unless a view of it is still held somewhere.
            if (u.grad_full.storage().use_count() == 1) detail::free_storage(u.grad_full, u.spare_grad);
            u.grad_full = torch::Tensor();
            u.pending = static_cast<int>(u.params.size());
          }
          std::fill(ready.begin(), ready.end(), false);
          next_launch = 0;
          ++stats.synced_steps;
        }
        reshard_all();
      }
    };

    std::shared_ptr<impl> impl_;
  };
};

}  // namespace strategy

DTRAIN_NAMESPACE_END
