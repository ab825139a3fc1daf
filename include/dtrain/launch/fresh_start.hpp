// SPDX-License-Identifier: Apache-2.0
#pragma once
// RunConfig::start = Start::fresh under torchrun, Slurm or Open MPI, where no driver of dtrain's
// moves the earlier run aside before the workers start: rank 0 does, and every rank waits for it.

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <dtrain/error.hpp>
#include <dtrain/launch/environment.hpp>
#include <dtrain/launch/rendezvous.hpp>
#include <dtrain/run_directory.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace launch {

/// Rank 0 renames `run_dir` to <name>.old-<UTC time> and publishes the new name on the store; the
/// other ranks wait (up to `timeout`) for that before they read anything of the run, so none sees
/// the earlier run's checkpoints. Only in the first group: a group the launcher restarted
/// (attempt > 0) continues the fresh run from its own checkpoints.
void start_fresh_under_launcher(c10d::Store& store, const WorkerIdentity& who,
                                const std::filesystem::path& run_dir, std::chrono::milliseconds timeout);

}  // namespace launch

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/launch/impl/fresh_start.ipp>
#endif
