#pragma once
// strategy::fsdp<>: fully sharded data parallelism. Parameters, gradients and optimizer state are
// split 1/N over the ranks; full parameters exist only around forward and backward.

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include <sys/mman.h>

#include <cerrno>
#include <cstring>

#include <c10/core/StorageImpl.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/nn/module.h>
#include <torch/types.h>

#include <dtrain/backend/gloo.hpp>
#include <dtrain/detail/buffer_sync.hpp>
#include <dtrain/error.hpp>
#include <dtrain/policy/category.hpp>

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

/// What one flat parameter (a "unit": one allgather, one reduce-scatter) covers.
enum class wrap {
  /// One unit for the whole model.
  whole_model,
  /// One unit per top-level submodule that has parameters (plus one for the root's own
  /// parameters): smaller collectives, and a unit's reduce-scatter starts as soon as backward
  /// has produced its gradients, while backward goes on through the units before it.
  top_level,
};

/// What the sharded model did so far: for tests and per-step breakdowns.
struct fsdp_stats {
  int units = 0;
  /// Values added to pad each unit to a multiple of the world size (all units, one rank's copy).
  std::int64_t padding = 0;
  std::int64_t allgathers = 0, reduce_scatters = 0, synced_steps = 0;
  /// Seconds spent waiting for allgathers (forward, and backward under full_shard) and for the
  /// reduce-scatters at the end of backward.
  double allgather_wait_s = 0, reduce_scatter_wait_s = 0;
};

namespace detail {
// The full parameters and flat gradients come and go every step. On CPU they are mapped straight
// from the kernel, so that freeing them gives the memory back: through malloc, glibc's dynamic
// mmap threshold soon serves buffers of this size from its heap, which keeps them resident (the
// multirank fsdp_memory scenario's 9.5M-parameter MLP on 2 workers peaked at 318 MB RSS through
// malloc against ddp<>'s 288 MB; mapped, below ddp<>).
struct mapping {
  void* at;
  std::size_t bytes;
};
inline void unmap(void* ctx) {
  auto* m = static_cast<mapping*>(ctx);
  ::munmap(m->at, m->bytes);
  delete m;
}
inline at::DataPtr map_bytes(std::size_t bytes, c10::Device device) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    throw Error("strategy::fsdp<>: cannot map " + std::to_string(bytes) + " bytes for full parameters or gradients (" +
                std::strerror(errno) + "); the worker is out of memory");
  return at::DataPtr(p, new mapping{p, bytes}, &unmap, device);
}

// Frees a tensor's memory but keeps its storage object, so that every view of it (also the views
// autograd saved for backward) sees the data again once allocate_storage() refills it.
inline void free_storage(const torch::Tensor& t) {
  auto* s = t.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(at::DataPtr(nullptr, t.device()));
  s->set_nbytes(0);
}
inline void allocate_storage(const torch::Tensor& t, std::size_t nbytes) {
  auto* s = t.storage().unsafeGetStorageImpl();
  if (t.device().is_cpu() && nbytes > 0) s->set_data_ptr_noswap(map_bytes(nbytes, t.device()));
  else s->set_data_ptr_noswap(s->allocator()->allocate(nbytes));
  s->set_nbytes(nbytes);
}
// A flat tensor of n zeros (fresh anonymous pages are zero: nothing to fill on CPU).
inline torch::Tensor flat_zeros(std::int64_t n, const torch::TensorOptions& options) {
  const auto bytes = static_cast<std::size_t>(n) * c10::elementSize(c10::typeMetaToScalarType(options.dtype()));
  if (!options.device().is_cpu() || bytes == 0) return torch::zeros({n}, options);
  auto data = map_bytes(bytes, options.device());
  c10::Storage storage(c10::Storage::use_byte_size_t(), bytes, std::move(data), nullptr, false);
  return torch::empty({0}, options).set_(storage, 0, {n}, {1});
}
}  // namespace detail

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
  /// The optimizer steps shards, so each rank checkpoints its own optimizer state.
  static constexpr bool shards_optimizer = true;

  template <class Communicator>
  class state {
   public:
    state(torch::nn::Module& module, Communicator& comm) : impl_(std::make_shared<impl>(module, comm)) {
      impl_->self = impl_;
      impl_->setup();
    }
    state(const state&) = delete;
    state& operator=(const state&) = delete;
    ~state() { impl_->remove_hooks(); }

    void set_sync(bool on) { impl_->sync = on; }
    const fsdp_stats& stats() const { return impl_->stats; }

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
    c10::Dict<std::string, at::Tensor> full_state() { return impl_->full_state(); }

    /// Loads full tensors by name (a model.pt of ddp<> or fsdp<>): this rank's shard of each
    /// unit, and the unsharded parameters and buffers. Throws Error naming a missing or misshapen
    /// tensor; `source` names where they came from.
    void load_full_state(const std::map<std::string, torch::Tensor>& state, const std::string& source) {
      impl_->load_full_state(state, source);
    }

    /// Bytes of parameters and gradients this rank holds now (shards, their gradients, anything
    /// gathered at the moment, unsharded parameters); the optimizer's state is not included.
    std::int64_t held_bytes() const { return impl_->held_bytes(); }

   private:
    struct unit {
      std::vector<std::size_t> params;    // indices into impl::params
      std::vector<std::int64_t> offsets;  // where each one starts in the flat vector
      std::int64_t numel = 0, shard_numel = 0;
      torch::Tensor full;       // padded flat parameters; memory only while gathered
      torch::Tensor shard;      // this rank's piece: a leaf the optimizer steps
      torch::Tensor grad_full;  // padded flat gradient, during a synchronised backward
      torch::Tensor grad_piece;
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
      std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;
      std::vector<std::uintptr_t> hook_keys;
      std::vector<bool> ready;
      std::size_t next_launch = 0;  // launches go units.size()-1 down to 0
      bool callback_queued = false, sync = true;
      dtrain::detail::buffer_sync buffers;
      fsdp_stats stats;

      void setup() {
        broadcast_state();
        // Units: the root's own parameters, then each top-level child's (or all in one).
        std::vector<std::vector<std::size_t>> groups;
        std::map<std::string, std::size_t> group_of_child;
        for (const auto& np : module.named_parameters(true)) {
          if (!np.value().requires_grad()) continue;
          const auto& name = np.key();
          std::size_t g = 0;
          if constexpr (Units == wrap::top_level) {
            const auto dot = name.find('.');
            const std::string child = dot == std::string::npos ? std::string() : name.substr(0, dot);
            auto [it, fresh] = group_of_child.try_emplace(child, groups.size());
            if (fresh) groups.emplace_back();
            g = it->second;
          } else {
            if (groups.empty()) groups.emplace_back();
          }
          index_of[np.value().unsafeGetTensorImpl()] = params.size();
          groups[g].push_back(params.size());
          params.push_back(np.value());
          names.push_back(name);
          shapes.push_back(np.value().sizes().vec());
        }
        buffers = dtrain::detail::buffer_sync(module);
        unit_of.assign(params.size(), 0);
        ready.assign(params.size(), false);
        const int world = comm.size(), rank = comm.rank();
        torch::NoGradGuard no_grad;
        for (auto& g : groups) {
          unit u;
          for (std::size_t k : g) {
            if (params[k].scalar_type() != params[g.front()].scalar_type() || params[k].device() != params[g.front()].device())
              throw ConfigError("strategy::fsdp<>: \"" + names[k] + "\" has another dtype or device than \"" +
                                names[g.front()] + "\" in the same unit; a unit is one flat tensor. Give the model " +
                                "one dtype, or use wrap::top_level with one dtype per top-level submodule");
            unit_of[k] = units.size();
            u.params.push_back(k);
            u.offsets.push_back(u.numel);
            u.numel += params[k].numel();
          }
          u.shard_numel = (u.numel + world - 1) / world;
          const auto& p0 = params[g.front()];
          u.full = torch::zeros({u.shard_numel * world}, p0.options().requires_grad(false));
          for (std::size_t i = 0; i < u.params.size(); ++i) {
            const auto& p = params[u.params[i]];
            u.full.narrow(0, u.offsets[i], p.numel()).copy_(p.detach().reshape({-1}));
          }
          u.shard = u.full.narrow(0, rank * u.shard_numel, u.shard_numel).clone().requires_grad_(true);
          u.pending = static_cast<int>(u.params.size());
          stats.padding += u.shard_numel * world - u.numel;
          units.push_back(std::move(u));
        }
        stats.units = static_cast<int>(units.size());
        // The accumulators are taken while the parameters still have their shapes: autograd
        // checks each gradient against the shape its accumulator was made for.
        for (std::size_t k = 0; k < params.size(); ++k) {
          auto acc = torch::autograd::impl::grad_accumulator(params[k]);
          std::weak_ptr<impl> weak = self;
          hook_keys.push_back(acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
              [weak, k](const torch::autograd::variable_list& outputs, const torch::autograd::variable_list&) {
                if (auto me = weak.lock()) me->on_grad_ready(k);
                return outputs;
              })));
          accumulators.push_back(std::move(acc));
          params[k].mutable_grad().reset();
        }
        for (auto& u : units) {
          u.gathered = true;  // u.full holds the full parameters: reshard frees it
          reshard(u);
        }
      }

      void remove_hooks() {
        for (std::size_t i = 0; i < accumulators.size(); ++i) accumulators[i]->del_post_hook(hook_keys[i]);
        accumulators.clear();
      }

      void broadcast_state() {
        if (comm.size() == 1) return;
        torch::NoGradGuard no_grad;
        std::vector<Work> works;
        std::vector<torch::Tensor> all;
        for (auto& p : module.parameters()) all.push_back(p.detach());
        for (auto& b : module.buffers()) all.push_back(b.detach());
        for (auto& t : all) works.push_back(comm.broadcast(t, 0));
        for (auto& w : works) w.wait();
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
          if (!u.gathered) detail::allocate_storage(u.full, u.full_bytes());
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
        detail::free_storage(u.full);
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
                me->queue_finish();
                me->gather_all();
                me->prepare_grads();
              }
            });
            reshard_all();
            return out;
          }
        }
        // Other outputs (tuples...) under full_shard keep the parameters through backward.
        if (needs_backward) prepare_grads();
        else reshard_all();
        return out;
      }

      void queue_finish() {
        if (callback_queued) return;
        callback_queued = true;
        std::weak_ptr<impl> weak = self;
        torch::autograd::Engine::get_default_engine().queue_callback([weak] {
          if (auto me = weak.lock()) me->finish_backward();
        });
      }

      void ensure_grad_full(unit& u) {
        if (!u.grad_full.defined()) u.grad_full = detail::flat_zeros(u.padded(), u.shard.options().requires_grad(false));
      }

      std::size_t slot_of(const unit& u, std::size_t k) const {
        std::size_t i = 0;
        while (u.params[i] != k) ++i;
        return i;
      }
      torch::Tensor slot(unit& u, std::size_t k) {
        const auto i = slot_of(u, k);
        return u.grad_full.narrow(0, u.offsets[i], numel_of(k));
      }
      bool aliased(std::size_t k) {
        auto& u = units[unit_of[k]];
        const auto& g = params[k].grad();
        return u.grad_full.defined() && g.defined() && g.data_ptr() == slot(u, k).data_ptr();
      }

      // Before backward: each parameter's .grad becomes a view of its unit's flat gradient, so
      // autograd accumulates straight into it (no second full-size copy). A .grad that was
      // replaced (module zero_grad, or assigned) is copied in and pointed back.
      void prepare_grads() {
        torch::NoGradGuard no_grad;
        for (auto& u : units) {
          ensure_grad_full(u);
          for (std::size_t k : u.params) {
            if (aliased(k)) continue;
            auto& g = params[k].mutable_grad();
            auto s = slot(u, k);
            if (g.defined()) s.copy_(g.reshape({-1}));
            g = s.view(shapes[k]);
          }
        }
      }

      void take_grad(std::size_t k) {
        auto& u = units[unit_of[k]];
        ensure_grad_full(u);
        if (!aliased(k)) {
          auto& g = params[k].mutable_grad();
          if (g.defined()) slot(u, k).copy_(g.reshape({-1}));
          else slot(u, k).zero_();
          g = slot(u, k).view(shapes[k]);
        }
        --u.pending;
      }

      void on_grad_ready(std::size_t k) {
        queue_finish();
        if (!sync || ready[k]) return;
        ready[k] = true;
        torch::NoGradGuard no_grad;
        take_grad(k);
        launch_ready();
      }

      void launch_ready() {
        while (next_launch < units.size()) {
          auto& u = units[units.size() - 1 - next_launch];
          if (u.pending > 0) break;
          ensure_grad_full(u);
          // The reduce-scatter uses the flat gradient as scratch: the aliases go first.
          for (std::size_t k : u.params) params[k].mutable_grad().reset();
          u.grad_piece = torch::empty({u.shard_numel}, u.grad_full.options());
          u.work = comm.reduce_scatter(u.grad_piece, u.grad_full, reduce::mean);
          ++stats.reduce_scatters;
          ++next_launch;
        }
      }

      void finish_backward() {
        callback_queued = false;
        torch::NoGradGuard no_grad;
        if (sync) {
          // Parameters that took no part in this backward contribute zeros (or what no_sync
          // accumulated), so every rank issues every unit's reduce-scatter in the same order.
          for (std::size_t k = 0; k < params.size(); ++k)
            if (!ready[k]) {
              ready[k] = true;
              take_grad(k);
            }
          launch_ready();
          Work buffers_work = buffers.start(comm);
          const auto t0 = std::chrono::steady_clock::now();
          for (auto& u : units) u.work.wait();
          buffers_work.wait();
          stats.reduce_scatter_wait_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          for (auto& u : units) {
            auto& g = u.shard.mutable_grad();
            if (g.defined()) g.add_(u.grad_piece);
            else g = u.grad_piece;
            u.grad_piece = torch::Tensor();
            u.grad_full = torch::Tensor();
            u.pending = static_cast<int>(u.params.size());
          }
          buffers.finish();
          std::fill(ready.begin(), ready.end(), false);
          next_launch = 0;
          ++stats.synced_steps;
        }
        reshard_all();
      }

      c10::Dict<std::string, at::Tensor> full_state() {
        torch::NoGradGuard no_grad;
        const bool root = comm.rank() == 0;
        std::map<std::string, torch::Tensor> gathered;
        for (auto& u : units) {
          const bool had = current(u);
          if (!had) {
            if (!u.gathered) detail::allocate_storage(u.full, u.full_bytes());
            u.gathered = true;  // for reshard() below
            comm.allgather(u.full, u.shard.detach()).wait();
            ++stats.allgathers;
            u.gathered_version = u.shard._version();
            set_views(u);
          }
          if (root)
            for (std::size_t i = 0; i < u.params.size(); ++i) {
              const auto k = u.params[i];
              gathered[names[k]] = u.full.narrow(0, u.offsets[i], numel_of(k)).view(shapes[k]).clone();
            }
          if (!had) reshard(u);
        }
        c10::Dict<std::string, at::Tensor> d;
        if (!root) return d;
        for (const auto& p : module.named_parameters(true)) {
          auto it = gathered.find(p.key());
          d.insert(p.key(), it != gathered.end() ? it->second : p.value().detach().clone());
        }
        for (const auto& b : module.named_buffers(true)) d.insert(b.key(), b.value().detach().clone());
        return d;
      }

      void load_full_state(const std::map<std::string, torch::Tensor>& state, const std::string& source) {
        torch::NoGradGuard no_grad;
        auto find = [&](const std::string& name, at::IntArrayRef shape) -> const torch::Tensor& {
          auto it = state.find(name);
          if (it == state.end())
            throw Error(source + " has no tensor \"" + name + "\"; was it saved from another model?");
          if (it->second.sizes() != shape)
            throw Error(source + ": \"" + name + "\" has shape " + c10::str(it->second.sizes()) + ", the model " +
                        c10::str(shape));
          return it->second;
        };
        const int rank = comm.rank();
        for (auto& u : units) {
          auto flat = torch::zeros({u.padded()}, u.shard.options().requires_grad(false));
          for (std::size_t i = 0; i < u.params.size(); ++i) {
            const auto k = u.params[i];
            flat.narrow(0, u.offsets[i], numel_of(k)).copy_(find(names[k], shapes[k]).reshape({-1}));
          }
          reshard(u);
          u.shard.detach().copy_(flat.narrow(0, rank * u.shard_numel, u.shard_numel));
        }
        for (auto& p : module.named_parameters(true))
          if (!index_of.count(p.value().unsafeGetTensorImpl())) p.value().detach().copy_(find(p.key(), p.value().sizes()));
        for (auto& b : module.named_buffers(true)) b.value().detach().copy_(find(b.key(), b.value().sizes()));
      }

      std::int64_t held_bytes() const {
        auto bytes = [](const torch::Tensor& t) {
          return t.defined() ? t.numel() * static_cast<std::int64_t>(t.element_size()) : std::int64_t{0};
        };
        std::int64_t n = 0;
        for (const auto& u : units) {
          n += bytes(u.shard) + bytes(u.shard.grad()) + bytes(u.grad_full) + bytes(u.grad_piece);
          if (u.gathered) n += static_cast<std::int64_t>(u.full_bytes());
        }
        for (const auto& p : module.parameters())
          if (!index_of.count(p.unsafeGetTensorImpl())) n += bytes(p) + bytes(p.grad());
        return n;
      }
    };

    std::shared_ptr<impl> impl_;
  };
};

}  // namespace strategy

DTRAIN_NAMESPACE_END
