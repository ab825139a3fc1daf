#pragma once
// checkpointer::directory<>: atomic, verified checkpoint directories under storage_path/name,
// written on a background thread, retained by score, found again on resume.

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/serialize/output-archive.h>

#include <dtrain/checkpointer/checkpoint.hpp>
#include <dtrain/config.hpp>
#include <dtrain/metrics.hpp>
#include <dtrain/policy/category.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace checkpointer {

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
  static constexpr bool persists = true;
  static constexpr bool asynchronous = Async;
};

/// What ctx.checkpoint(model, optimizer, extras) took on the training thread: clones, so the
/// training can go on while they are written.
struct Snapshot {
  bool has_model = false;
  c10::Dict<std::string, at::Tensor> model;  // rank 0 only: the state is replicated
  std::string optimizer;                     // rank 0 only: the serialized OutputArchive
  bool sharded_optimizer = false;            // every rank's own optimizer state (strategy::fsdp<>)
  Metrics extras;
  torch::Tensor generator;  // this rank's default CPU generator
  std::int64_t epoch = 0, position = 0, steps = 0;
};

/// A checkpoint known to the retention of a running group.
struct Entry {
  std::int64_t iteration = 0;
  std::filesystem::path path;
  Metrics metrics;
};

/// Removes the checkpoints `config` does not keep: the num_to_keep best by score_attribute (or the
/// newest), plus the latest and the best, are kept. Called after a new checkpoint is complete.
inline void retain(std::vector<Entry>& index, const CheckpointConfig& config) {
  if (config.num_to_keep <= 0 || index.empty()) return;
  const bool higher = config.score_order == ScoreOrder::max;
  std::vector<Entry> ranked = index;
  std::stable_sort(ranked.begin(), ranked.end(), [&](const Entry& a, const Entry& b) {
    return scores_better(a.metrics, a.iteration, b.metrics, b.iteration, config.score_attribute, higher);
  });
  std::int64_t latest = 0;
  for (const auto& e : index) latest = std::max(latest, e.iteration);
  std::vector<std::int64_t> keep{latest, ranked.front().iteration};
  for (std::size_t i = 0; i < ranked.size() && i < static_cast<std::size_t>(config.num_to_keep); ++i)
    keep.push_back(ranked[i].iteration);
  std::vector<Entry> kept;
  for (auto& e : index) {
    if (std::find(keep.begin(), keep.end(), e.iteration) != keep.end()) {
      kept.push_back(std::move(e));
      continue;
    }
    std::error_code ec;
    // The manifest goes first: a removal cut short leaves a directory that no longer verifies.
    std::filesystem::remove(e.path / files::manifest, ec);
    std::filesystem::remove_all(e.path, ec);
  }
  index = std::move(kept);
}

/// Every checkpoint under `run_dir` whose manifest verifies, newest first; each is verified once.
/// With `warn`, each damaged one is reported on stderr with its path and the reason.
inline std::vector<Checkpoint> all_valid(const std::filesystem::path& run_dir, bool warn = false) {
  std::vector<Checkpoint> out;
  for (const auto& [iteration, dir] : list(run_dir)) {
    std::string why;
    if (auto c = Checkpoint::open(dir, &why)) out.push_back(std::move(*c));
    else if (warn)
      std::fprintf(stderr, "dtrain: warning: checkpoint %s is damaged (%s); it is skipped\n", dir.c_str(), why.c_str());
  }
  return out;
}

/// The best of `checkpoints` by `config` (score_attribute and score_order; the newest when no
/// score attribute is set), or nothing when there are none.
inline std::optional<Checkpoint> best_of(const std::vector<Checkpoint>& checkpoints, const CheckpointConfig& config) {
  const bool higher = config.score_order == ScoreOrder::max;
  const Checkpoint* best = nullptr;
  for (const auto& c : checkpoints)
    if (!best || scores_better(c.metrics(), c.iteration(), best->metrics(), best->iteration(), config.score_attribute, higher))
      best = &c;
  if (!best) return std::nullopt;
  return *best;
}

/// The best checkpoint under `run_dir` whose manifest verifies, ranked as `config` ranks them
/// (score_attribute and score_order; the newest when no score attribute is set), or nothing when
/// there is none. Damaged checkpoints are passed over.
inline std::optional<Checkpoint> best_valid(const std::filesystem::path& run_dir, const CheckpointConfig& config) {
  return best_of(all_valid(run_dir), config);
}

namespace detail {

inline std::string optimizer_bytes(const auto& optimizer) {
  torch::serialize::OutputArchive archive;
  optimizer.save(archive);
  std::ostringstream os;
  archive.save_to(os);
  return os.str();
}

/// The iteration at which DTRAIN_FAULT_CHECKPOINT_WRITE asks rank 0 of the first attempt to die
/// halfway through writing model.pt (a test hook for crashes during a checkpoint write).
inline std::optional<std::int64_t> fault_iteration() {
  const char* v = std::getenv("DTRAIN_FAULT_CHECKPOINT_WRITE");
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::stoll(v);
}

/// optimizer.pt of a checkpoint whose optimizer state is sharded: an archive that names the world
/// size, so that a plain optimizer.load() of it fails instead of loading something else.
inline std::string sharded_optimizer_marker(int world_size) {
  torch::serialize::OutputArchive archive;
  archive.write(sharded_optimizer_key, torch::tensor(static_cast<std::int64_t>(world_size)));
  std::ostringstream os;
  archive.save_to(os);
  return os.str();
}

/// Writes this rank's file of checkpoint `iteration` into the temporary directory.
inline void write_rank_file(const std::filesystem::path& tmp, int rank, const Snapshot& s) {
  const auto gen = s.generator.contiguous();
  nlohmann::json j = {{"rank", rank},
                      {"epoch", s.epoch},
                      {"position", s.position},
                      {"rng", to_hex(gen.data_ptr<std::uint8_t>(), static_cast<std::size_t>(gen.numel()))}};
  write_file(tmp / files::rank(rank), j.dump());
  if (s.sharded_optimizer) write_file(tmp / files::rank_optimizer(rank), s.optimizer);
}

/// Rank 0's part: the replicated state, then (once every rank's file is there, `wait_for_ranks`)
/// the manifest, the rename into place and the fsync of the run directory. Returns the new path.
template <class WaitForRanks>
std::filesystem::path commit(const std::filesystem::path& run_dir, std::int64_t iteration, int world_size,
                             const Snapshot& s, const Metrics& reported, bool crash_inside,
                             WaitForRanks&& wait_for_ranks) {
  namespace fs = std::filesystem;
  const fs::path tmp = run_dir / temporary_name(iteration);
  nlohmann::json entries = nlohmann::json::array();
  auto add = [&](const std::string& name, std::uint64_t size, std::uint32_t crc) {
    entries.push_back({{"name", name}, {"size", size}, {"crc32", crc}});
  };
  const auto model = torch::jit::pickle_save(c10::IValue(s.model));
  if (crash_inside) crash_after_bytes() = model.size() / 2;
  add(files::model, model.size(), write_file(tmp / files::model, model.data(), model.size()));
  // Optimizer state sharded per rank: optimizer.pt only says so, each rank's file holds its piece.
  const std::string optimizer = s.sharded_optimizer ? sharded_optimizer_marker(world_size) : s.optimizer;
  add(files::optimizer, optimizer.size(), write_file(tmp / files::optimizer, optimizer));
  const nlohmann::json state = {{"iteration", iteration}, {"epoch", s.epoch}, {"position", s.position},
                                {"steps", s.steps}, {"world_size", world_size},
                                {"metrics", reported}, {"extras", s.extras}};
  const auto state_text = state.dump(2);
  add(files::state, state_text.size(), write_file(tmp / files::state, state_text));
  if (!wait_for_ranks()) return {};
  for (int r = 0; r < world_size; ++r) {
    const auto [crc, size] = crc32_of_file(tmp / files::rank(r));
    add(files::rank(r), size, crc);
    if (s.sharded_optimizer) {
      const auto [ocrc, osize] = crc32_of_file(tmp / files::rank_optimizer(r));
      add(files::rank_optimizer(r), osize, ocrc);
    }
  }
  const nlohmann::json manifest = {{"format", 1}, {"iteration", iteration}, {"world_size", world_size},
                                   {"files", entries}};
  write_file(tmp / files::manifest, manifest.dump(2));
  fsync_directory(tmp);
  const fs::path dest = run_dir / directory_name(iteration);
  std::error_code ec;
  // Only a damaged checkpoint of this iteration (the newest valid one is older) can be there.
  if (fs::exists(dest, ec)) fs::remove_all(dest, ec);
  fs::rename(tmp, dest, ec);
  if (ec) throw Error(dest.string() + ": cannot rename the checkpoint into place (" + ec.message() + ")");
  fsync_directory(run_dir);
  return dest;
}

}  // namespace detail

}  // namespace checkpointer

DTRAIN_NAMESPACE_END
