// SPDX-License-Identifier: Apache-2.0
#pragma once
// checkpointer::directory<>: atomic, verified checkpoint directories under storage_path/name,
// written on a background thread, retained by score, found again on resume.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <future>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <dtrain/checkpointer/checkpoint.hpp>
#include <dtrain/checkpointer/selection.hpp>
#include <dtrain/checkpointer/retention.hpp>
#include <dtrain/checkpointer/write.hpp>
#include <dtrain/config.hpp>
#include <dtrain/launch/group.hpp>
#include <dtrain/metrics.hpp>
#include <dtrain/policy/category.hpp>
#include <dtrain/run_directory.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace checkpointer {

namespace detail {
template <bool Async>
class directory_state;
}  // namespace detail

/// Checkpoints as directories: `ctx.report(metrics, ctx.checkpoint(model, optimizer))` saves
/// storage_path/name/checkpoint_NNNNNN/ (NNNNNN: the report's iteration), see checkpoint.hpp for
/// the layout. The state is cloned on the training thread; with `Async` (the default) the files are
/// written on a background thread while training goes on, and the next checkpoint waits for the
/// previous write. RunConfig::checkpoint says which checkpoints are kept; a restarted or re-run
/// fit() resumes from the latest one whose manifest verifies.
///
/// Every rank writes its own small file (sampler position, generator state) into the checkpoint,
/// so storage_path must be one file system that every rank sees (as Ray's storage_path is).
template <bool Async = true>
struct directory {
  using category = dtrain::category::checkpointer;
  static constexpr const char* name = "directory";
  static constexpr bool asynchronous = Async;
  using state = detail::directory_state<Async>;
};

namespace detail {

/// directory<Async>'s per-worker state; checkpointer::none::state documents each member.
template <bool Async>
class directory_state {
 public:
  static constexpr bool persists = true;

  /// Rank 0 picks the checkpoint to resume from (the newest valid one of the run directory, else
  /// RunConfig::resume_from), warning about damaged ones and removing unfinished writes; every
  /// rank gets the same answer.
  directory_state(const launch::Group& group, const RunConfig& run)
      : group_(group), config_(run.checkpoint), dir_(run.path()) {
    const auto chosen = group_.decide("checkpoint/resume", [&] { return choose(run); });
    if (chosen.empty()) return;
    std::string why;
    resumed_ = Checkpoint::open(chosen, &why, /*verify_files=*/false);  // rank 0 verified it
    if (!resumed_)
      throw Error(chosen + ": the checkpoint rank 0 chose cannot be opened on rank " + std::to_string(group_.rank()) +
                  " (" + why + "); does every rank see the same storage path?");
  }

  ~directory_state() {
    // A write still running after an error: rank 0's stops waiting for the other ranks' files.
    abort_ = true;
    if (pending_.valid()) pending_.wait();
  }
  directory_state(const directory_state&) = delete;
  directory_state& operator=(const directory_state&) = delete;

  const std::optional<Checkpoint>& resumed() const { return resumed_; }

  /// Writes `snapshot` as checkpoint `iteration`: every rank its own file, rank 0 the rest, the
  /// manifest and the rename once every rank's file is there; then retention. On a background
  /// thread when Async.
  void save(Snapshot&& snapshot, std::int64_t iteration, Metrics reported) {
    const auto t0 = std::chrono::steady_clock::now();
    auto work = [this, s = std::move(snapshot), iteration, reported = std::move(reported)]() -> double {
      const auto start = std::chrono::steady_clock::now();
      write(s, iteration, reported);
      return seconds_since(start);
    };
    if constexpr (Async) {
      pending_ = std::async(std::launch::async, std::move(work));
    } else {
      std::promise<double> done;
      done.set_value(work());
      pending_ = done.get_future();
    }
    stats_.blocked_s += seconds_since(t0);
  }

  void wait() {
    if (!pending_.valid()) return;
    const double took = pending_.get();  // rethrows what the write threw
    stats_.write_s += took;
    stats_.last_write_s = took;
    ++stats_.written;
  }

  std::optional<Checkpoint> best() const { return best_valid(dir_.path(), config_); }

  void add_blocked(double seconds) { stats_.blocked_s += seconds; }
  const CheckpointStats& stats() const { return stats_; }

  void finish() {
    wait();
    if (group_.rank() == 0) write_file(dir_.checkpoint_stats(), nlohmann::json(stats_).dump() + "\n");
  }

 private:
  static double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  // Rank 0: the checkpoint to resume from, or "" for a fresh start; the index retention starts
  // from.
  std::string choose(const RunConfig& run) {
    dir_.create();
    dir_.remove_unfinished_checkpoints();
    std::string unloadable;  // the checkpoints a worker of this run could not load, and why
    auto ck = latest_valid(dir_.path(), true, [&](const auto& dir) { return unloadable_reason(dir); }, &unloadable);
    if (!ck && !unloadable.empty())  // starting afresh would overwrite them: the user decides
      throw ConfigError("no checkpoint of " + dir_.path().string() + " can be loaded into this run" + unloadable +
                        ". Fix the model (or optimizer) to match them, or start afresh (" + start_advice(Start::fresh) +
                        "), which moves the old run aside");
    if (!ck && run.resume_from) {
      std::string why;
      ck = Checkpoint::open(*run.resume_from, &why);
      if (ck && !(why = unloadable_reason(*run.resume_from)).empty()) ck.reset();
      if (!ck)
        throw ConfigError("RunConfig::resume_from " + run.resume_from->string() + " cannot be resumed from: " + why +
                          "; and " + dir_.path().string() +
                          " holds no valid checkpoint either. Point resume_from at a checkpoint_NNNNNN directory "
                          "whose manifest verifies, or unset it to start afresh.");
    }
    if (!ck) return "";
    for (const auto& [iteration, dir] : dir_.checkpoints())
      if (iteration <= ck->iteration())
        if (auto c = Checkpoint::open(dir, nullptr, false)) index_.insert(index_.begin(), {iteration, dir, c->metrics()});
    return ck->path().string();
  }

  // Why a worker of this run could not load checkpoint `dir` (ctx.restore marks it), or "".
  std::string unloadable_reason(const std::filesystem::path& dir) const {
    const auto key = unloadable_key(dir);
    return group_.store().check({key}) ? launch::to_string(group_.store().get(key)) : std::string();
  }

  void write(const Snapshot& s, std::int64_t iteration, const Metrics& reported) {
    const auto tmp = dir_.temporary_checkpoint(iteration);
    std::error_code ec;
    std::filesystem::create_directories(tmp, ec);
    if (ec) throw Error(tmp.string() + ": cannot create the checkpoint directory (" + ec.message() +
                        "); check that the storage path is writable and not full");
    write_rank_file(tmp, group_.rank(), s);
    const auto written = group_.key("checkpoint/" + std::to_string(iteration) + "/written");
    group_.store().add(written, 1);
    if (group_.rank() != 0) return;
    auto wait_for_ranks = [&] {
      const auto deadline = std::chrono::steady_clock::now() + group_.timeout();
      while (group_.store().add(written, 0) < group_.size()) {
        if (abort_) return false;
        if (std::chrono::steady_clock::now() > deadline)
          throw WorkerError("rank 0 waited " + std::to_string(group_.timeout().count()) +
                            " ms for the other ranks' files of " + tmp.string());
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      return true;
    };
    const auto dest = commit(dir_.path(), iteration, group_.size(), s, reported, wait_for_ranks);
    if (dest.empty()) return;
    index_.push_back({iteration, dest, reported});
    retain(index_, config_);
  }

  const launch::Group& group_;
  CheckpointConfig config_;
  RunDirectory dir_;
  std::optional<Checkpoint> resumed_;
  std::future<double> pending_;  // at most one write in flight
  std::atomic<bool> abort_{false};
  CheckpointStats stats_;
  std::vector<Entry> index_;  // rank 0: the checkpoints retention knows
};

}  // namespace detail

}  // namespace checkpointer

DTRAIN_NAMESPACE_END
