// SPDX-License-Identifier: Apache-2.0
#pragma once
// The autograd skeleton that strategy::ddp<> and strategy::fsdp<> share: rank 0's state broadcast
// when a model is wrapped, post-accumulate hooks on the parameters' gradient accumulators, the
// engine callback at the end of backward, and the end-of-backward wait. This is the code most
// exposed to LibTorch's autograd internals, so it lives once.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/nn/module.h>
#include <torch/types.h>

#include <dtrain/collective.hpp>
#include <dtrain/detail/buffer_sync.hpp>
#include <dtrain/detail/torch_compat.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace strategy::detail {

/// Rank 0's parameters and buffers become every rank's (nothing to do alone): all broadcasts are
/// launched, then awaited.
template <class Communicator>
void broadcast_state(torch::nn::Module& module, Communicator& comm) {
  if (comm.size() == 1) return;
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> all;
  for (auto& p : module.parameters()) all.push_back(p.detach());
  for (auto& b : module.buffers()) all.push_back(b.detach());
  std::vector<Work> works;
  for (auto& t : all) works.push_back(comm.broadcast(t, 0));
  for (auto& w : works) w.wait();
}

/// Post-accumulate hooks and the end-of-backward callback of one wrapped model, calling into its
/// `Owner` (the strategy's state): `owner->on_grad_ready(k)` once autograd has accumulated
/// parameter k's gradient, and `owner->finish_backward()` once the backward pass ends.
///
/// An object of this class must be a member of its Owner: the callbacks reach it through the
/// owner, and do nothing once the owner is gone (a backward still running when the model's state
/// was destroyed).
template <class Owner>
class gradient_hooks {
 public:
  gradient_hooks() = default;
  gradient_hooks(const gradient_hooks&) = delete;
  gradient_hooks& operator=(const gradient_hooks&) = delete;
  ~gradient_hooks() { remove(); }

  /// Hooks each of `params` (index k in this list). Autograd checks each gradient against the
  /// shape the accumulator was made for, so call it while the parameters have their real shapes.
  void install(std::weak_ptr<Owner> owner, const std::vector<torch::Tensor>& params) {
    owner_ = std::move(owner);
    for (std::size_t k = 0; k < params.size(); ++k) {
      auto acc = torch::autograd::impl::grad_accumulator(params[k]);
      keys_.push_back(acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
          [weak = owner_, k](const torch::autograd::variable_list& outputs, const torch::autograd::variable_list&) {
            if (auto me = weak.lock()) me->on_grad_ready(k);
            return outputs;
          })));
      accumulators_.push_back(std::move(acc));
    }
  }

  /// Removes the hooks: the parameters outlive the wrapping (the model belongs to the user).
  void remove() {
    for (std::size_t i = 0; i < accumulators_.size(); ++i) accumulators_[i]->del_post_hook(keys_[i]);
    accumulators_.clear();
    keys_.clear();
  }

  /// Has owner->finish_backward() run when the current backward pass ends; once per pass however
  /// often it is called. Call it from inside backward (a hook).
  void queue_finish() {
    if (queued_) return;
    queued_ = true;
    torch::autograd::Engine::get_default_engine().queue_callback([weak = owner_, this] {
      if (auto me = weak.lock()) {
        queued_ = false;  // `this` lives in *me
        me->finish_backward();
      }
    });
  }

 private:
  std::weak_ptr<Owner> owner_;
  std::vector<compat::grad_accumulator_ptr> accumulators_;
  std::vector<std::uintptr_t> keys_;
  bool queued_ = false;
};

/// A gradient copied into its flat slot in a bucket or unit: zeros where it is undefined, and a
/// sparse one (an Embedding made with `.sparse(true)`) added to zeros.
void write_grad(torch::Tensor slot, const torch::Tensor& g, at::IntArrayRef sizes);

/// The end of a synchronised backward: rank 0's floating-point buffers are broadcast while the
/// gradients' collectives (`work_of(item)` for each of `items`, launched during backward) finish;
/// waits for all of them and writes the buffers back. Returns the seconds spent waiting.
template <class Items, class WorkOf, class Communicator>
double wait_for_gradients(Items& items, WorkOf work_of, dtrain::detail::buffer_sync& buffers, Communicator& comm) {
  Work buffers_work = buffers.start(comm);
  const auto t0 = std::chrono::steady_clock::now();
  for (auto& item : items) std::invoke(work_of, item).wait();
  buffers_work.wait();
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  buffers.finish();
  return waited;
}

}  // namespace strategy::detail

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/strategy/detail/impl/gradient_hooks.ipp>
#endif
