// SPDX-License-Identifier: Apache-2.0
#pragma once
// Writing a checkpoint: what ctx.checkpoint() takes on the training thread (Snapshot), each rank's
// own file, and rank 0's commit (the replicated state, the manifest, the rename into place).
//
// A checkpoint is written into `.tmp_checkpoint_NNNNNN` beside its final name, every file fsynced,
// then the directory is renamed into place and the run directory fsynced: a checkpoint_* directory
// is complete or absent, and the manifest catches what the disk damaged later.

#include <cstdint>
#include <filesystem>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/serialize/output-archive.h>
#include <torch/types.h>

#include <dtrain/checkpointer/files.hpp>
#include <dtrain/error.hpp>
#include <dtrain/metrics.hpp>
#include <dtrain/run_directory.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace checkpointer {

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

namespace detail {

inline std::string optimizer_bytes(const auto& optimizer) {
  torch::serialize::OutputArchive archive;
  optimizer.save(archive);
  std::ostringstream os;
  archive.save_to(os);
  return os.str();
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
                             const Snapshot& s, const Metrics& reported, WaitForRanks&& wait_for_ranks) {
  namespace fs = std::filesystem;
  const fs::path tmp = RunDirectory(run_dir).temporary_checkpoint(iteration);
  nlohmann::json entries = nlohmann::json::array();
  auto add = [&](const std::string& name, std::uint64_t size, std::uint32_t crc) {
    entries.push_back({{"name", name}, {"size", size}, {"crc32", crc}});
  };
  const auto model = torch::jit::pickle_save(c10::IValue(s.model));
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
  const fs::path dest = RunDirectory(run_dir).checkpoint(iteration);
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
