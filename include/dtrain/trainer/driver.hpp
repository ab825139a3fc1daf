// SPDX-License-Identifier: Apache-2.0
#pragma once
// Trainer::fit() without its types: the driver (each worker group started, watched, stopped on a
// signal and restarted from the latest checkpoint while FailureConfig allows, the run recorded)
// and a worker's life around its train loop (signals, store, rendezvous, the record under an
// external launcher, the error it leaves for the driver). What depends on the Trainer's types, the
// Context and the loop, reaches it as a TrainLoop; what it needs of the policies, as
// TrainerPolicies. So this code is compiled once (in dtrain's library under
// DTRAIN_SEPARATE_COMPILATION), not in every program for each Trainer type.

#include <functional>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <dtrain/config.hpp>
#include <dtrain/launch/environment.hpp>
#include <dtrain/result.hpp>
#include <dtrain/tracking/run_tracking.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace detail {

/// What the driver and the workers need to know of a Trainer's policies.
struct TrainerPolicies {
  tracking::PolicyNames names;     // params.json's "policies" and "use_gpu"
  tracking::TrackerHooks tracker;  // the Tracker's start, heartbeat and end
  bool persists = false;           // the Checkpointer writes and reads checkpoints
  bool shards_optimizer = false, reshards_optimizer = false;  // the Strategy's optimizer state
};

/// The typed part of a worker: builds the Context for `who` over `store`, runs the train loop in
/// it and finishes it. Returns whether a stop request cut the loop short.
using TrainLoop = std::function<bool(const launch::WorkerIdentity& who, c10::intrusive_ptr<c10d::Store> store)>;

/// Trainer::fit(): in a worker (started by dtrain's driver, torchrun, Slurm or Open MPI) runs
/// `train` for this rank and ends the process; in the driver starts the workers, watches them and
/// returns the Result.
Result fit_trainer(const ScalingConfig& scaling, const RunConfig& run, const TrainerPolicies& policies,
                   const TrainLoop& train);

}  // namespace detail

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/trainer/impl/driver.ipp>
#endif
