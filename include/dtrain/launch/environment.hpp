// SPDX-License-Identifier: Apache-2.0
#pragma once
// Who this process is: the driver, or a worker placed by dtrain's driver, torchrun, Slurm or Open MPI.

#include <cstdlib>
#include <optional>
#include <string>

#include <dtrain/error.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace launch {

/// A worker's place in the group, read from its launcher's environment variables.
struct WorkerIdentity {
  int rank = 0, world_size = 1;
  int local_rank = 0, local_world_size = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  /// The rendezvous store is hosted by dtrain's driver; otherwise rank 0 hosts it (env://).
  bool store_on_driver = false;
  /// torchrun's agent hosts the store at MASTER_ADDR:MASTER_PORT (its static rendezvous sets
  /// TORCHELASTIC_USE_AGENT_STORE=True): every rank, rank 0 too, connects to it as a client.
  bool store_on_agent = false;
  /// How many times dtrain's driver restarted the group before this one (0 for the first).
  int attempt = 0;
  /// "dtrain", "torchrun", "slurm" or "openmpi".
  std::string launcher;
};

/// Environment variables dtrain's driver sets for its workers beside torchrun's.
inline constexpr const char* env_store_on_driver = "DTRAIN_STORE_ON_DRIVER";
inline constexpr const char* env_attempt = "DTRAIN_ATTEMPT";
/// The run directory of the fit() the workers were started for: a worker that runs the program
/// from its start (not a fork) passes over the fit() calls before it (Trainer::fit).
inline constexpr const char* env_run_path = "DTRAIN_RUN_PATH";

namespace detail {
std::optional<std::string> env(const char* name);

int env_int(const char* name, int fallback, bool required = false);
/// The task count of node `node` in Slurm's per-node list ("2(x3),1": 2 tasks on each of the first
/// three nodes, then 1), as SLURM_STEP_TASKS_PER_NODE gives it.
int slurm_tasks_on_node(const std::string& list, int node);
}  // namespace detail

/// MASTER_PORT as a TCP port, or `fallback` when it is unset (0: the kernel picks one). A value
/// that is not a port is a ConfigError naming it (it would otherwise wrap into another port).
int master_port(int fallback, bool required = false);

/// The worker identity the environment describes, or nothing when this process is a driver.
///
/// Precedence: torchrun's variables (RANK, WORLD_SIZE, ..., also what dtrain's driver sets), then
/// Slurm's (SLURM_PROCID inside an srun step), then Open MPI's (OMPI_COMM_WORLD_RANK). Under Slurm and
/// Open MPI, MASTER_ADDR and MASTER_PORT must name the host and port where rank 0 hosts the store.
std::optional<WorkerIdentity> detect_worker();

}  // namespace launch

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/launch/impl/environment.ipp>
#endif
