// SPDX-License-Identifier: Apache-2.0
#pragma once
// The Backend concept and backend_traits: the single source of truth for what a Backend policy
// provides (docs/design.md links here).

#include <chrono>
#include <concepts>
#include <functional>
#include <utility>

#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/types.h>

#include <dtrain/collective.hpp>
#include <dtrain/concept/archetypes.hpp>
#include <dtrain/launch/environment.hpp>
#include <dtrain/policy/category.hpp>

DTRAIN_NAMESPACE_BEGIN

/// @concept Backend: how workers talk (collectives between ranks).
///
/// Minimal complete definition
/// - `using category = dtrain::category::backend;`
/// - `static constexpr bool uses_cuda`: whether device() is a GPU (collectives take device tensors).
/// - `static torch::Device device(int local_rank)`: the device a worker trains on.
/// - a nested `communicator`, constructible from (const c10::intrusive_ptr<c10d::Store>&, const
///   launch::WorkerIdentity&, std::chrono::milliseconds timeout), with
///   - `int rank() const`, `int size() const`;
///   - `Work allreduce(torch::Tensor& t, reduce op)`: t reduced in place over ranks;
///   - `Work broadcast(torch::Tensor& t, int root)`: root's t into every rank's t;
///   - `Work allgather(torch::Tensor& flat_out, const torch::Tensor& in)`: flat allgather;
///   - `Work reduce_scatter(torch::Tensor& out, torch::Tensor& flat_in, reduce op)` (flat_in may be
///     used as scratch);
///   - `void barrier()`.
///   strategy::fsdp<> is written against allgather and reduce_scatter; everything dtrain calls on
///   a communicator is in this list or in backend_traits, so a model of this concept needs nothing
///   else (concept/archetypes.hpp's archetype::backend has exactly these members).
///
/// Optional members (defaults in backend_traits)
/// - `static constexpr bool available` (default true): false when this build lacks what the
///   backend needs; policy::set rejects such a backend with a message naming the fix.
/// - `using batch_transfer = ...` (default: none): a data::Transfer that ctx.shard() uses to move
///   the next batch to device() while the current one trains.
/// - `communicator::on_stall(std::function<void()> check)` (default: not called): runs `check`
///   about once a second while a collective waits for a peer; `check` may throw to end the wait.
///   Without it a collective that waits for a dead peer ends at RunConfig::collective_timeout.
/// - `communicator::synchronize()` (default: nothing): waits for collectives that complete on a
///   device; called before the worker reports that it finished.
/// - `communicator::allreduce(t, op, runs)` and `broadcast(t, root, runs)` (default: the two-
///   argument forms): where the collective runs (dtrain::runs); strategy::ddp<> runs the last
///   bucket's allreduce and the buffers' broadcast `by_waiter`, as it waits for them at once.
///
/// Laws (tests/laws/backend.hpp checks them for 1-3 ranks on integer-valued tensors)
/// - after every rank's allreduce(t, sum).wait(), every rank's t is the elementwise sum (max, min
///   alike; mean is sum / size());
/// - after broadcast(t, root).wait(), every rank's t is root's;
/// - after allgather(out, in).wait(), out[r*n, (r+1)*n) is rank r's `in` (n = in.numel());
/// - after reduce_scatter(out, in, sum).wait(), rank r's `out` is the sum over ranks of
///   in[r*n, (r+1)*n) (n = out.numel());
/// - barrier() returns on a rank only once every rank called it;
/// - the collectives of one communicator complete in the order they were issued, on every rank.
///
/// Models: backend::gloo, backend::gloo_with_threads<N> (Gloo has no reduce-scatter: through
/// shared memory on one host, an allreduce plus a copy across hosts), backend::nccl.
template <class B>
concept BackendPolicy = PolicyOf<B, category::backend> &&
    std::constructible_from<typename B::communicator, const c10::intrusive_ptr<c10d::Store>&,
                            const launch::WorkerIdentity&, std::chrono::milliseconds> &&
    requires(typename B::communicator& c, const typename B::communicator& cc, torch::Tensor& t) {
      { B::uses_cuda } -> std::convertible_to<bool>;
      { B::device(0) } -> std::convertible_to<torch::Device>;
      { cc.rank() } -> std::convertible_to<int>;
      { cc.size() } -> std::convertible_to<int>;
      { c.allreduce(t, reduce::sum) } -> std::same_as<Work>;
      { c.broadcast(t, 0) } -> std::same_as<Work>;
      { c.allgather(t, std::as_const(t)) } -> std::same_as<Work>;
      { c.reduce_scatter(t, t, reduce::sum) } -> std::same_as<Work>;
      c.barrier();
    };

/// Every optional member of a Backend, with its documented default (see BackendPolicy above).
/// The worker context calls these; nothing else looks for optional backend members. They apply
/// to an unavailable backend too (backend::nccl without CUDA has no communicator at all), so the
/// communicator's are function templates over B::communicator.
template <class B>
struct backend_traits {
  /// B::available, or true.
  static constexpr bool available = [] {
    if constexpr (requires { B::available; }) return bool(B::available);
    else return true;
  }();

  /// Whether B names a batch_transfer for ctx.shard() to prefetch batches to the device with.
  static constexpr bool has_batch_transfer = requires { typename B::batch_transfer; };

  /// c.on_stall(check), or nothing: a collective then waits until RunConfig::collective_timeout.
  template <class Communicator>
  static void on_stall(Communicator& c, std::function<void()> check) {
    if constexpr (requires { c.on_stall(std::move(check)); }) c.on_stall(std::move(check));
  }

  /// c.synchronize(), or nothing: a host backend's collective is done when its Work::wait() returns.
  template <class Communicator>
  static void synchronize(Communicator& c) {
    if constexpr (requires { c.synchronize(); }) c.synchronize();
  }
};

static_assert(BackendPolicy<archetype::backend>,
              "dtrain: the BackendPolicy concept asks for more than its minimal complete definition "
              "(archetype::backend in concept/archetypes.hpp); keep the two in step");

DTRAIN_NAMESPACE_END
