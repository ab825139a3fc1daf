// SPDX-License-Identifier: Apache-2.0
#pragma once
// ctx.graphed_step(opt, forward): a whole training step (forward, backward, optimizer step)
// captured once in a CUDA graph and replayed, for models whose shapes do not change. A replay
// launches the step's hundreds of kernels with one call, so the GPU no longer waits on the host
// between them (Python's `torch.cuda.graph`, PyTorch's "whole network capture").
//
// How a call runs:
//   - the first GraphOptions::warmup_steps calls are ordinary steps, on a side stream (what
//     capture needs: cuBLAS's workspaces, autograd's nodes and the optimizer's state exist after);
//   - the next one captures the step on that stream into the graph's private memory pool, then
//     replays it;
//   - later calls copy their inputs into the captured ones and replay. Inputs of another shape or
//     dtype (an epoch's last, smaller batch) take an ordinary step instead; a checkpoint or restore
//     that gave the optimizer new state tensors makes the next call capture again.
// Learning rates a scheduler changes reach the graph (a device tensor refilled before a replay);
// any other optimizer option is fixed at capture (see precision/captured_step.hpp).
//
// What cannot be captured is refused: loss scaling (amp<fp16>: its skip is decided on the host) and
// an optimizer other than SGD, Adam and AdamW at compile time; a CPU device, more than one worker
// (DDP's allreduce is checked on the host per collective) and LibTorch before 2.3 when the step is
// made; host work inside `forward` (.item(), printing, a CPU tensor) when it is captured.

#include <array>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/types.h>

#include <dtrain/detail/cuda.hpp>
#include <dtrain/error.hpp>
#include <dtrain/precision/captured_step.hpp>

#if DTRAIN_CUDA_GRAPHS
#include <ATen/autocast_mode.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#endif

DTRAIN_NAMESPACE_BEGIN

/// How ctx.graphed_step captures.
struct GraphOptions {
  /// Ordinary steps before the capture (at least 1: the optimizer's state must exist).
  int warmup_steps = 3;
};

template <class Context, class Optimizer, class Forward>
class GraphedStep {
  using precision_state = std::remove_reference_t<decltype(std::declval<Context&>().precision())>;
  static constexpr bool scales_loss = [] {
    if constexpr (requires { precision_state::loss_scaling; }) return bool(precision_state::loss_scaling);
    else return false;
  }();

 public:
  GraphedStep(Context& ctx, Optimizer& opt, Forward forward, GraphOptions options)
      : ctx_(ctx), opt_(opt), forward_(std::move(forward)), options_(options) {
    static_assert(!scales_loss,
                  "dtrain: ctx.graphed_step cannot capture amp<fp16>'s loss scaling (whether a step is skipped is "
                  "decided on the host); use precision::amp<bf16> or fp32, or step with ctx.backward and ctx.step");
    static_assert(std::is_same_v<Optimizer, torch::optim::SGD> || std::is_same_v<Optimizer, torch::optim::Adam> ||
                      std::is_same_v<Optimizer, torch::optim::AdamW>,
                  "dtrain: ctx.graphed_step captures torch::optim::SGD, Adam and AdamW (their fused kernels read the "
                  "learning rate and step counts from the device); step other optimizers with ctx.backward and "
                  "ctx.step");
    const std::string refused = "ctx.graphed_step: ";
    if (options_.warmup_steps < 1)
      throw ConfigError(refused + "GraphOptions::warmup_steps is " + std::to_string(options_.warmup_steps) +
                        "; give at least 1 (the optimizer's state must exist before the capture)");
    if (!DTRAIN_CUDA_GRAPHS)
      throw ConfigError(refused + "this LibTorch (" TORCH_VERSION ") cannot capture CUDA graphs here (it needs a "
                        "CUDA build of LibTorch 2.3 or later); step with ctx.backward and ctx.step");
    if (!ctx.device().is_cuda())
      throw ConfigError(refused + "the workers run on " + ctx.device().str() +
                        "; CUDA graphs capture GPU work: use backend::nccl on a GPU, or step with ctx.backward "
                        "and ctx.step");
    if (ctx.world_size() != 1)
      throw ConfigError(refused + "the group has " + std::to_string(ctx.world_size()) +
                        " workers; capturing the gradients' allreduce is not supported (dtrain checks every "
                        "collective against the other ranks' on the host), so a graphed step runs on one worker. "
                        "Use ScalingConfig::num_workers = 1, or step with ctx.backward and ctx.step");
  }
  ~GraphedStep() { drop_graph(); }
  GraphedStep(const GraphedStep&) = delete;
  GraphedStep& operator=(const GraphedStep&) = delete;

  /// One training step on `inputs` (tensors on the worker's device): forward(inputs...) returns
  /// the loss, then backward and the optimizer step. Returns the loss (a tensor of its own).
  template <class... Inputs>
  torch::Tensor operator()(const Inputs&... inputs) {
    static_assert(sizeof...(Inputs) > 0 && (std::is_convertible_v<const Inputs&, const torch::Tensor&> && ...),
                  "dtrain: a graphed step takes the batch as tensors: step(batch.data, batch.target)");
#if DTRAIN_CUDA_GRAPHS
    const std::array<torch::Tensor, sizeof...(Inputs)> in{inputs...};
    if (++calls_ <= options_.warmup_steps) return on_side_stream([&] { return eager(inputs...); });
    if (graph_ && !optimizer_->current()) drop_graph();  // a checkpoint renewed the optimizer's state
    if (!graph_) return capture(in);
    for (std::size_t i = 0; i < in.size(); ++i)
      if (in[i].sizes() != static_inputs_[i].sizes() || in[i].dtype() != static_inputs_[i].dtype() ||
          in[i].device() != static_inputs_[i].device())
        return eager(inputs...);
    for (std::size_t i = 0; i < in.size(); ++i) static_inputs_[i].copy_(in[i], /*non_blocking=*/true);
    return replay();
#else
    return eager(inputs...);  // unreachable: the constructor refused
#endif
  }

  /// Whether a graph is captured now.
  bool captured() const { return graph_.has_value(); }
  /// Steps taken by replaying the graph, captures (the first and any after a checkpoint renewed
  /// the optimizer's state), and ordinary steps (the warm-up and inputs of another shape).
  std::int64_t replays() const { return replays_; }
  std::int64_t captures() const { return captures_; }
  std::int64_t eager_steps() const { return eager_; }

 private:
  // The graph's last replay may still run: its memory goes back to the allocator only after.
  void drop_graph() {
#if DTRAIN_CUDA_GRAPHS
    if (!graph_) return;
    try {
      c10::cuda::getCurrentCUDAStream(ctx_.device().index()).synchronize();
    } catch (...) {  // a failed device: nothing runs any more
    }
    graph_.reset();
#endif
  }

  template <class... Inputs>
  torch::Tensor eager(const Inputs&... inputs) {
    opt_.zero_grad();
    auto loss = forward_(inputs...);
    ctx_.backward(loss);
    ctx_.step(opt_);
    ++eager_;
    return loss.detach();
  }

#if DTRAIN_CUDA_GRAPHS
  // Runs `f` on the side stream, ordered after and before the caller's stream (capture needs a
  // stream other than the default one; the warm-up runs there too so that its cuBLAS workspace
  // and allocations are the capture's).
  template <class F>
  auto on_side_stream(F f) {
    const auto caller = c10::cuda::getCurrentCUDAStream(ctx_.device().index());
    if (!side_) side_ = c10::cuda::getStreamFromPool(false, ctx_.device().index());
    detail::cuda_event ready, done;
    ready.record(caller);
    ready.block(*side_);
    auto result = [&] {
      c10::cuda::CUDAStreamGuard guard(*side_);
      return f();
    }();
    done.record(*side_);
    done.block(caller);
    return result;
  }

  template <std::size_t N>
  torch::Tensor capture(const std::array<torch::Tensor, N>& in) {
    optimizer_.emplace(opt_);  // before zero_grad: it lists the parameters that have gradients
    static_inputs_.clear();
    for (const auto& t : in) static_inputs_.push_back(t.detach().clone());  // on the caller's stream, as replays
    static_grads_.clear();
    on_side_stream([&] {
      opt_.zero_grad();  // the captured backward allocates the gradients in the graph's pool
      graph_.emplace();
      const bool cache = at::autocast::is_autocast_cache_enabled();
      at::autocast::set_autocast_cache_enabled(false);  // casts made inside the graph, not reused from outside
      // Thread-local: the context's other threads (the NCCL watchdog, the prefetcher) keep
      // making CUDA calls while this one captures.
      graph_->capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
      try {
        static_loss_ = std::apply(forward_, as_tuple(std::make_index_sequence<N>{}));
        ctx_.precision().backward(static_loss_);
        optimizer_->capture();
        graph_->capture_end();
      } catch (const std::exception& e) {
        at::autocast::set_autocast_cache_enabled(cache);
        abandon_capture();
        throw Error(std::string("ctx.graphed_step: the step could not be captured in a CUDA graph: ") + e.what() +
                    "\nA captured step runs on the GPU without the host: no .item(), no printing or reading a "
                    "tensor, no CPU tensors, no shapes that depend on values; or step with ctx.backward and "
                    "ctx.step");
      }
      at::autocast::set_autocast_cache_enabled(cache);
      return 0;
    });
    ++captures_;
    for (auto& group : opt_.param_groups())
      for (auto& p : group.params())
        if (p.grad().defined()) static_grads_.emplace_back(p, p.grad());
    return replay();  // the capture ran nothing: this call's step is its first replay
  }

  template <std::size_t... I>
  auto as_tuple(std::index_sequence<I...>) const {
    return std::tie(static_inputs_[I]...);
  }

  void abandon_capture() {
    try {
      if (graph_) graph_->capture_end();
    } catch (...) {  // ending an invalidated capture throws; the stream leaves capture mode either way
    }
    graph_.reset();
    optimizer_.reset();
  }

  torch::Tensor replay() {
    optimizer_->before_replay();
    // ctx.step's callers may have set the gradients to none (zero_grad): the graph writes its own.
    for (auto& [p, g] : static_grads_)
      if (!p.grad().is_same(g)) p.mutable_grad() = g;
    graph_->replay();
    ++replays_;
    auto loss = static_loss_.detach().clone();  // the next replay overwrites static_loss_
    ctx_.count_replayed_step(loss);
    return loss;
  }

  std::optional<at::cuda::CUDAGraph> graph_;
  std::optional<precision::detail::captured_step> optimizer_;
  std::optional<c10::cuda::CUDAStream> side_;
#else
  struct no_graph {};
  std::optional<no_graph> graph_;
#endif

  Context& ctx_;
  Optimizer& opt_;
  Forward forward_;
  GraphOptions options_;
  std::vector<torch::Tensor> static_inputs_;
  std::vector<std::pair<torch::Tensor, torch::Tensor>> static_grads_;  // parameter, its captured gradient
  torch::Tensor static_loss_;
  std::int64_t calls_ = 0, replays_ = 0, captures_ = 0, eager_ = 0;
};

DTRAIN_NAMESPACE_END
