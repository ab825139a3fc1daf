#pragma once
// The run-time configuration of a Trainer, after Ray Train's ScalingConfig and RunConfig.
// What is fixed when the binary is compiled lives in the policies instead.

#include <chrono>
#include <filesystem>
#include <string>

#include <dtrain/error.hpp>

DTRAIN_NAMESPACE_BEGIN

/// How many workers, and what each gets.
struct ScalingConfig {
  /// Worker processes fit() starts when it runs as the driver (>= 1).
  int num_workers = 1;
  /// Intra-op threads per worker; OPENBLAS_NUM_THREADS and OMP_NUM_THREADS are set to the same
  /// number, so BLAS does not start threads of its own beside torch's pool.
  int threads_per_worker = 1;

  void validate() const {
    if (num_workers < 1)
      throw ConfigError("ScalingConfig::num_workers is " + std::to_string(num_workers) +
                        "; it must be at least 1");
    if (threads_per_worker < 1)
      throw ConfigError("ScalingConfig::threads_per_worker is " + std::to_string(threads_per_worker) +
                        "; it must be at least 1");
  }
};

/// Where the run's files go, and how long workers wait for each other.
struct RunConfig {
  /// The run's directory is storage_path / name.
  std::filesystem::path storage_path = "dtrain_runs";
  std::string name = "run";
  /// How long workers wait for every rank to join the group before giving up with an error naming
  /// the ranks that never arrived.
  std::chrono::milliseconds rendezvous_timeout = std::chrono::seconds(60);
  /// How long one collective may take before it fails (a peer that hangs, or died silently).
  std::chrono::milliseconds collective_timeout = std::chrono::seconds(300);

  std::filesystem::path path() const { return storage_path / name; }

  void validate() const {
    if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
      throw ConfigError("RunConfig::name \"" + name +
                        "\" must be a single, non-empty directory name (no '/')");
    if (rendezvous_timeout.count() <= 0 || collective_timeout.count() <= 0)
      throw ConfigError("RunConfig: rendezvous_timeout and collective_timeout must be positive");
  }
};

DTRAIN_NAMESPACE_END
