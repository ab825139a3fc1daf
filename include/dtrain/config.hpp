// SPDX-License-Identifier: Apache-2.0
#pragma once
// The run-time configuration of a Trainer, after Ray Train's ScalingConfig and RunConfig.
// What is fixed when the binary is compiled lives in the policies instead.

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include <dtrain/error.hpp>
#include <dtrain/metrics.hpp>

DTRAIN_NAMESPACE_BEGIN

/// How many workers, and what each gets. Whether they use GPUs is the Backend's choice
/// (backend::nccl: one GPU per worker), made when the Trainer is compiled (Trainer::uses_gpu).
struct ScalingConfig {
  /// Worker processes fit() starts when it runs as the driver (>= 1); in an elastic run (see
  /// min_workers), the most it runs, which it starts with and grows back to.
  int num_workers = 1;
  /// Intra-op threads per worker; OPENBLAS_NUM_THREADS and OMP_NUM_THREADS are set to the same
  /// number, so BLAS does not start threads of its own beside torch's pool.
  int threads_per_worker = 1;
  /// The fewest workers an elastic run continues with (dtrain's own driver; 1 <= min_workers <=
  /// num_workers). Unset: num_workers, a fixed size. When the same rank ends the group twice in a
  /// row with no newer checkpoint between, the driver counts that worker as lost and restarts the
  /// group one worker smaller, from the latest checkpoint; see docs/multi-host.md, "Elastic groups".
  std::optional<int> min_workers = std::nullopt;
  /// A group smaller than num_workers grows back to num_workers at its regrow_after_checkpoints-th
  /// checkpoint: its ranks stop right after that checkpoint and num_workers resume from it (>= 1).
  int regrow_after_checkpoints = 2;

  void validate() const;

  /// The fewest workers the run continues with: min_workers, or num_workers when it is unset.
  int minimum_workers() const { return min_workers.value_or(num_workers); }
  /// Whether the group may run smaller than num_workers (min_workers < num_workers).
  bool elastic() const { return minimum_workers() < num_workers; }
};

/// Whether a higher or a lower score is better (CheckpointConfig::score_attribute).
enum class ScoreOrder { min, max };

/// Which checkpoints a run keeps (Ray's CheckpointConfig). Applies under checkpointer::directory<>.
///
/// Retention never removes the latest checkpoint nor the best one, and removes an old checkpoint
/// only after a newer one is complete on disk.
struct CheckpointConfig {
  /// How many checkpoints to keep, ranked by score_attribute (or by recency when it is empty);
  /// 0 keeps all. The latest and the best are kept beside these.
  int num_to_keep = 0;
  /// The reported metric that ranks checkpoints ("val_loss", "test_accuracy"); empty: recency.
  std::string score_attribute;
  /// Whether a higher (max, as Ray's default) or a lower (min) score is better.
  ScoreOrder score_order = ScoreOrder::max;
  /// Also write optimizer_state.pt: a torch optimizer's state (SGD, Adam, AdamW, RMSprop, Adagrad
  /// under ddp<>) as Python's optimizer.state_dict(), for torch.load in Python. A second copy of
  /// the optimizer state beside optimizer.pt (for AdamW, twice the model's size), so off unless asked.
  bool python_optimizer_state = false;

  void validate() const {
    if (num_to_keep < 0)
      throw ConfigError("CheckpointConfig::num_to_keep is " + std::to_string(num_to_keep) +
                        "; use 0 to keep every checkpoint, or a positive count");
  }
};

/// What the driver does when a worker fails (Ray's FailureConfig).
struct FailureConfig {
  /// How many failures of the worker group to recover from by starting a new group that resumes
  /// from the latest valid checkpoint; 0 stops at the first failure, -1 never stops.
  int max_failures = 0;
  /// Whether fit() throws (WorkerError when the run failed, Stopped when a signal stopped it) or
  /// returns a Result whose `error` says why. Throwing is the default: a failed run must not pass
  /// for a finished one in code that never looks at the Result.
  bool throw_on_failure = true;
  /// After SIGINT or SIGTERM to the driver: how long the workers get to stop on their own (the
  /// loop sees ctx.should_stop(), a checkpoint being written completes) before SIGKILL. A second
  /// signal kills them at once.
  std::chrono::milliseconds stop_grace = std::chrono::seconds(30);
  /// About how often rank 0 checks for a stop request (its own signal, the group's stop key) at a
  /// step every rank knows; the others read its answer at that step (see ctx.should_stop()).
  std::chrono::milliseconds stop_poll = std::chrono::milliseconds(100);
  /// The pause before the first restart; it doubles with each consecutive failure that made no
  /// progress (no newer checkpoint), up to restart_backoff_max.
  std::chrono::milliseconds restart_backoff = std::chrono::milliseconds(500);
  std::chrono::milliseconds restart_backoff_max = std::chrono::seconds(30);
  /// A failure with the same cause, from the same checkpoint step, this many times in a row stops
  /// the run even under max_failures = -1: restarting again would only fail again (a full disk, a
  /// checkpoint of another model). 0: never.
  int max_repeated_failures = 3;
  /// A rank whose heartbeat (its own thread, about once a second) stands still this long while
  /// another waits for it in a collective or a report is taken as failed: the waiting rank names
  /// it and its host, and the group restarts under max_failures. A busy rank keeps beating; a
  /// stopped (SIGSTOP), frozen or cut-off one does not. 0 turns heartbeats off.
  std::chrono::milliseconds heartbeat_timeout = std::chrono::seconds(10);
  /// A rank whose training thread shows no progress this long while its heartbeat goes on is taken
  /// as stuck (a deadlock or an endless loop in the train loop, a read from a dead mount) and the
  /// group restarts under max_failures. Progress is each batch ctx.shard hands out, each collective
  /// issued or completed, each report(), each dtrain::mark_progress(); a rank that waits for its
  /// peers counts as progressing. Found by the ranks that wait for it and by dtrain's driver (also
  /// when every rank is stuck, or the group has one worker); the driver stops the group with
  /// SIGTERM, then SIGKILL after stop_grace. 0 (the default) turns it off: a loop may legitimately
  /// go on for any time without such a point (an evaluation over plain tensors, loading data inside
  /// the loop, a long checkpoint write), so set it above the longest such stretch and below
  /// RunConfig::collective_timeout; see docs/multi-host.md, "Workers that make no progress".
  std::chrono::milliseconds progress_timeout = std::chrono::milliseconds(0);

  void validate() const;
};

/// How much rank 0 prints while it trains (RunConfig::progress).
enum class Verbosity {
  quiet,    ///< nothing but errors and warnings
  normal,   ///< the progress line (epoch, step/total, samples/s, loss, ETA)
  verbose,  ///< the progress line, and one line per report() with its metrics
};

/// Rank 0's live progress on stderr. On a terminal one line is redrawn in place (at most every
/// `refresh`); otherwise (a log file, a pipe) a plain line is written every `interval`.
/// The environment variable DTRAIN_VERBOSITY (quiet, normal, verbose) overrides `verbosity`.
struct ProgressConfig {
  Verbosity verbosity = Verbosity::normal;
  std::chrono::milliseconds interval = std::chrono::seconds(10);
  std::chrono::milliseconds refresh = std::chrono::milliseconds(200);
  /// Every this many optimizer steps rank 0 appends a row to the run directory's steps.jsonl: the
  /// mean loss given to ctx.backward since the last row, the group's samples/s over those steps
  /// and the values ctx.log_step() was given, so that report.html draws curves within an epoch.
  /// Whatever the verbosity; 0 records nothing. No collective: other ranks do nothing.
  std::int64_t record_every = 10;

  void validate() const;
};

/// What fit() does with a run directory an earlier run of the same name left (RunConfig::start).
enum class Start {
  /// Continue it from its latest valid checkpoint (Ray Train's behaviour for a repeated name).
  resume,
  /// Start over: the driver renames the earlier directory to <name>.old-<UTC time> before any
  /// worker starts (under a launcher, rank 0 of the first group, the others waiting); nothing is
  /// deleted.
  fresh,
};

/// How an error message says to choose `s`: the C++ setting and the command-line flag of dtrain's
/// example programs (--fresh, --resume), since who reads the message may know only the flags of
/// the program they ran.
inline std::string start_advice(Start s) {
  return s == Start::fresh
             ? "RunConfig::start = dtrain::Start::fresh in code; --fresh on the command line of dtrain's examples"
             : "RunConfig::start = dtrain::Start::resume in code, the default; --resume or no flag on the command "
               "line of dtrain's examples";
}

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
  /// Retention of checkpoints (checkpointer::directory<>).
  CheckpointConfig checkpoint = {};
  /// Restarts after worker failures.
  FailureConfig failure = {};
  /// A checkpoint directory to start from when the run directory holds no valid checkpoint of its
  /// own (a run directory's own latest valid checkpoint always wins on a restart).
  std::optional<std::filesystem::path> resume_from = std::nullopt;
  /// Rank 0's progress line and its verbosity.
  ProgressConfig progress = {};
  /// The train loop's own settings (Ray's train_loop_config: learning rate, batch, model...),
  /// written once to the run's params with the Trainer's policies and these configs. The loop
  /// reads them back as ctx.run_config().train_loop_config.
  Metrics train_loop_config = {};
  /// Resume an earlier run of this name (the default), or move it aside and start afresh.
  Start start = Start::resume;
  /// The seed of the Trainer's Sampler (sampler::distributed's shuffle) in place of its template
  /// Seed; unset: dtrain::enable_reproducibility's seed if called, else the template's.
  std::optional<std::uint64_t> seed = std::nullopt;

  std::filesystem::path path() const { return storage_path / name; }

  void validate() const;
};

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/impl/config.ipp>
#endif
