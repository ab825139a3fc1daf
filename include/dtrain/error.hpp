// SPDX-License-Identifier: Apache-2.0
#pragma once
// The exceptions dtrain throws. Every message says what was wrong and what to do about it.

#include <stdexcept>
#include <string>

#include <dtrain/version.hpp>

DTRAIN_NAMESPACE_BEGIN

/// Base of every dtrain error.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// A configuration that cannot work (num_workers < 1, a batch that does not divide, ...).
struct ConfigError : Error {
  using Error::Error;
};

/// A dataset that is missing or malformed; the message names the file and the problem.
struct DataError : Error {
  using Error::Error;
};

/// Workers that could not find each other: a port in use, a rank that never arrived.
struct RendezvousError : Error {
  using Error::Error;
};

/// A process that asked for a rank another process of the run already holds (two workers started
/// with one RANK, or a stale process of another run that shares the secret and the port). It is
/// not the group's failure: the process that holds the rank goes on.
struct RankTaken : RendezvousError {
  using RendezvousError::RendezvousError;
};

/// A worker that threw, exited non-zero or died by a signal; the message names the rank and cause.
struct WorkerError : Error {
  using Error::Error;
};

/// A run stopped by SIGINT or SIGTERM to the driver (FailureConfig::stop_grace); the run
/// directory's outcome is "stopped" and running the same name again resumes it.
struct Stopped : Error {
  using Error::Error;
};

DTRAIN_NAMESPACE_END
