#pragma once
// One concept per policy category: what a policy of that category must provide. policy::set checks
// the resolved policies against them, so a policy of your own that lacks a piece is rejected with
// a message naming the category, not deep inside the Trainer.

#include <concepts>
#include <cstdint>
#include <vector>

#include <torch/nn/module.h>
#include <torch/types.h>

#include <dtrain/backend/gloo.hpp>
#include <dtrain/policy/category.hpp>
#include <dtrain/concept/checkpointer.hpp>
#include <dtrain/concept/sampler.hpp>
#include <dtrain/concept/tracker.hpp>

DTRAIN_NAMESPACE_BEGIN

/// Backend. Minimal complete definition: `static constexpr bool uses_cuda`; `static torch::Device
/// device(int local_rank)`; a nested `communicator` constructible from (store, WorkerIdentity,
/// timeout) with `rank()`, `size()`, `allreduce(tensor&, reduce) -> Work`, `broadcast(tensor&, root)
/// -> Work`, `allgather(flat_out&, in) -> Work`, `reduce_scatter(out&, flat_in&, reduce) -> Work`,
/// `barrier()`. strategy::fsdp<> is written against allgather and reduce_scatter.
/// Laws: after every rank's allreduce(t, sum).wait(), every rank's t is the elementwise sum; after
/// allgather(out, in).wait(), out[r*n, (r+1)*n) is rank r's `in` (n = in.numel()); after
/// reduce_scatter(out, in, sum).wait(), rank r's `out` is the sum over ranks of in[r*n, (r+1)*n)
/// (n = out.numel()); the collectives of one communicator complete in the order they were issued,
/// on every rank.
/// Optional: `available` (false: this build lacks what the backend needs; policy::set then rejects
/// it with a message naming the fix), `batch_transfer` (how ctx.shard() moves batches to device()).
/// Models: backend::gloo (Gloo has no reduce-scatter: through shared memory on one host, an
/// allreduce plus a copy across hosts), backend::nccl (ncclAllGather, ncclReduceScatter).
template <class B>
concept BackendPolicy = PolicyOf<B, category::backend> && requires(typename B::communicator& c, torch::Tensor& t) {
  { B::uses_cuda } -> std::convertible_to<bool>;
  { B::device(0) } -> std::convertible_to<torch::Device>;
  { c.rank() } -> std::convertible_to<int>;
  { c.size() } -> std::convertible_to<int>;
  { c.allreduce(t, reduce::sum) } -> std::same_as<Work>;
  { c.broadcast(t, 0) } -> std::same_as<Work>;
  { c.allgather(t, t) } -> std::same_as<Work>;
  { c.reduce_scatter(t, t, reduce::sum) } -> std::same_as<Work>;
  c.barrier();
};

/// Strategy. Minimal complete definition: a nested `template <class Communicator> class state`
/// constructible from (torch::nn::Module&, Communicator&), with `set_sync(bool)`. Optional, found
/// by detection: `parameters()` (what the optimizer steps; the model's parameters when absent),
/// `forward(f)` (runs the model's forward f around gathering), `check_optimizer(params)`,
/// `full_state()` and `load_full_state(tensors, source)` (checkpoints in ddp<>'s model.pt format),
/// `held_bytes()`, and `static constexpr bool shards_optimizer` (each rank checkpoints its own
/// optimizer state).
/// Laws: after a synchronised backward every rank holds the same gradients (under fsdp<>: the same
/// full gradient, each rank its shard of it); under set_sync(false) backward issues no collective.
/// Models: strategy::ddp<>, strategy::fsdp<>.
template <class S>
concept StrategyPolicy = PolicyOf<S, category::strategy> &&
    std::constructible_from<typename S::template state<backend::gloo::communicator>, torch::nn::Module&,
                            backend::gloo::communicator&> &&
    requires(typename S::template state<backend::gloo::communicator>& s) { s.set_sync(true); };

/// Precision. Minimal complete definition: `static constexpr bool requires_cuda`; a nested `state`
/// constructible from torch::Device with `autocast()` (an RAII scope), `backward(loss)` and
/// `step(optimizer) -> bool` (false: the step was skipped). Optional: a constructor from
/// (torch::Device, Communicator&), which the context prefers (amp's GradScaler agrees on overflows
/// over ranks); `loss_scaling`, `skipped_steps()` and `loss_scale()`, which the metrics rows report.
/// Models: precision::fp32, precision::amp<bf16>, precision::amp<fp16>.
template <class P>
concept PrecisionPolicy = PolicyOf<P, category::precision> && std::constructible_from<typename P::state, torch::Device> &&
    requires(typename P::state& s, const torch::Tensor& loss) {
      { P::requires_cuda } -> std::convertible_to<bool>;
      s.autocast();
      s.backward(loss);
    };

DTRAIN_NAMESPACE_END
