// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of environment.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/launch/environment.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace launch {
namespace detail {

DTRAIN_INLINE std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

DTRAIN_INLINE int env_int(const char* name, int fallback, bool required) {
  const auto v = env(name);
  if (!v) {
    if (required)
      throw ConfigError(std::string("environment variable ") + name +
                        " is not set; the launcher must set it for every worker");
    return fallback;
  }
  try {
    std::size_t used = 0;
    const int n = std::stoi(*v, &used);
    if (used != v->size()) throw std::invalid_argument(*v);
    return n;
  } catch (const std::exception&) {
    throw ConfigError(std::string("environment variable ") + name + "=\"" + *v +
                      "\" is not an integer");
  }
}

DTRAIN_INLINE int slurm_tasks_on_node(const std::string& list, int node) {
  std::size_t at = 0;
  int index = 0;
  while (at < list.size()) {
    std::size_t used = 0;
    int tasks = 0, repeat = 1;
    try {
      tasks = std::stoi(list.substr(at), &used);
      at += used;
      if (list.compare(at, 2, "(x") == 0) {
        repeat = std::stoi(list.substr(at + 2), &used);
        at += 2 + used + 1;  // past ")"
      }
    } catch (const std::exception&) {
      break;
    }
    if (node < index + repeat) return tasks;
    index += repeat;
    if (at < list.size() && list[at] == ',') ++at;
  }
  throw ConfigError("SLURM_STEP_TASKS_PER_NODE=\"" + list + "\" gives no task count for node " + std::to_string(node) +
                    "; run the workers inside an srun step");
}
}  // namespace detail

DTRAIN_INLINE int master_port(int fallback, bool required) {
  const auto v = detail::env("MASTER_PORT");
  if (!v) return detail::env_int("MASTER_PORT", fallback, required);
  long long port = -1;
  try {
    std::size_t used = 0;
    port = std::stoll(*v, &used);
    if (used != v->size()) port = -1;
  } catch (const std::exception&) {
  }
  if (port < 1 || port > 65535)
    throw ConfigError("MASTER_PORT=" + *v + " is not a port (1-65535); set it to a free TCP port, or unset it "
                      "and dtrain's driver picks one");
  return static_cast<int>(port);
}

DTRAIN_INLINE std::optional<WorkerIdentity> detect_worker() {
  using detail::env;
  using detail::env_int;
  WorkerIdentity w;
  if (env("RANK")) {
    w.rank = env_int("RANK", 0);
    w.world_size = env_int("WORLD_SIZE", 1, true);
    w.local_rank = env_int("LOCAL_RANK", w.rank);
    w.local_world_size = env_int("LOCAL_WORLD_SIZE", w.world_size);
    w.node_rank = env_int("GROUP_RANK", w.local_world_size ? w.rank / w.local_world_size : 0);
    w.store_on_driver = env(env_store_on_driver).has_value();
    w.store_on_agent = !w.store_on_driver && env("TORCHELASTIC_USE_AGENT_STORE") == std::optional<std::string>("True");
    w.attempt = env_int(env_attempt, env_int("TORCHELASTIC_RESTART_COUNT", 0));
    w.launcher = w.store_on_driver ? "dtrain" : "torchrun";
  } else if (env("SLURM_PROCID") && env("SLURM_STEP_NUM_TASKS")) {
    w.rank = env_int("SLURM_PROCID", 0);
    w.world_size = env_int("SLURM_STEP_NUM_TASKS", 1);
    w.local_rank = env_int("SLURM_LOCALID", 0);
    w.node_rank = env_int("SLURM_NODEID", 0);
    const auto per_node = env("SLURM_STEP_TASKS_PER_NODE");
    w.local_world_size = per_node ? detail::slurm_tasks_on_node(*per_node, w.node_rank)
                                  : env_int("SLURM_NTASKS_PER_NODE", 1);
    w.launcher = "slurm";
  } else if (env("OMPI_COMM_WORLD_RANK")) {
    w.rank = env_int("OMPI_COMM_WORLD_RANK", 0);
    w.world_size = env_int("OMPI_COMM_WORLD_SIZE", 1, true);
    w.local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK", 0);
    w.local_world_size = env_int("OMPI_COMM_WORLD_LOCAL_SIZE", 1);
    w.node_rank = w.local_world_size ? w.rank / w.local_world_size : 0;
    w.launcher = "openmpi";
  } else {
    return std::nullopt;
  }
  if (w.world_size < 1 || w.rank < 0 || w.rank >= w.world_size)
    throw ConfigError("launcher variables give rank " + std::to_string(w.rank) + " of world size " +
                      std::to_string(w.world_size) + "; the rank must be in [0, world size)");
  const bool external = w.launcher == "slurm" || w.launcher == "openmpi";
  const auto addr = env("MASTER_ADDR");
  if (!addr && external && w.world_size > 1)
    throw ConfigError("running under " + w.launcher +
                      " without MASTER_ADDR: export MASTER_ADDR (the first node's address) and "
                      "MASTER_PORT (a free port there) to every task");
  w.master_addr = addr.value_or("127.0.0.1");
  w.master_port = master_port(29500, w.world_size > 1 && !external && !w.store_on_driver);
  return w;
}
}  // namespace launch
DTRAIN_NAMESPACE_END
