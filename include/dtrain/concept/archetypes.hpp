// SPDX-License-Identifier: Apache-2.0
#pragma once
// Archetypes: for each concept of concept/, a type with exactly its minimal complete definition
// and nothing else. Each concept is checked against its archetype (so that it asks for no more
// than it documents), and the strategies and precisions are checked against the archetype
// communicator (so that they use no more of a backend than the Backend concept promises).
//
// Their members are declared, never defined: they exist for concept checks, and a program that
// calls one fails to link.

#include <chrono>

#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/nn/module.h>
#include <torch/types.h>

#include <dtrain/collective.hpp>
#include <dtrain/launch/environment.hpp>
#include <dtrain/policy/category.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace archetype {

/// The Backend concept's communicator: rank, size, the four collectives and barrier.
class communicator {
 public:
  communicator(const c10::intrusive_ptr<c10d::Store>& store, const launch::WorkerIdentity& who,
               std::chrono::milliseconds timeout);
  communicator(const communicator&) = delete;
  communicator& operator=(const communicator&) = delete;

  int rank() const;
  int size() const;
  Work allreduce(torch::Tensor& t, reduce op);
  Work broadcast(torch::Tensor& t, int root);
  Work allgather(torch::Tensor& flat_out, const torch::Tensor& in);
  Work reduce_scatter(torch::Tensor& out, torch::Tensor& flat_in, reduce op);
  void barrier();
};

/// A Backend with no optional member (no `available`, no `batch_transfer`).
struct backend {
  using category = dtrain::category::backend;
  static constexpr bool uses_cuda = false;
  static torch::Device device(int local_rank);
  using communicator = archetype::communicator;
};

/// A Strategy with no optional member: its state is built and toggled, nothing more.
struct strategy {
  using category = dtrain::category::strategy;
  template <class Communicator>
  class state {
   public:
    state(torch::nn::Module& module, Communicator& comm);
    state(const state&) = delete;
    state& operator=(const state&) = delete;
    void set_sync(bool on);
  };
};

/// A Precision with no optional member: built from a device only, no loss scaling.
struct precision {
  using category = dtrain::category::precision;
  static constexpr bool requires_cuda = false;
  class state {
   public:
    struct scope {};
    explicit state(torch::Device device);
    scope autocast() const;
    void backward(const torch::Tensor& loss);
    template <class Optimizer>
    bool step(Optimizer& optimizer);
  };
};

}  // namespace archetype

DTRAIN_NAMESPACE_END
