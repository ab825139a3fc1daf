// SPDX-License-Identifier: Apache-2.0
#pragma once
// A checkpoint's JSON files read field by field: manifest.json, state.json and rank_RRRRR.json.
//
// A resume acts on every number in them, and a checksum only says that the bytes are the ones the
// manifest was sealed over, not that the writer was dtrain. So every field is checked for its type
// and range, and the files against each other and against the directory's name. What fails throws
// DamagedFile, whose message begins with the file's name and names the field; Checkpoint::open
// reports it as it reports a bad CRC-32, and the run falls back to an older checkpoint.
//
// The rules (docs/checkpoints.md, "What a checkpoint must hold"):
// - counts (iteration, epoch, position, steps, offset, samples) are JSON integers in [0, max_count]
//   (iteration from 1; offset and samples -1 for "unknown"), world sizes in [1, max_world_size];
// - manifest.json has format 1, the checkpoint's iteration and world size, and lists each file
//   once by a relative name, with its size and CRC-32, including model.pt, optimizer.pt,
//   state.json and exactly one rank_RRRRR.json per rank;
// - state.json's iteration is the directory's (checkpoint_NNNNNN) and the manifest's, its world
//   size the manifest's, its metrics and extras objects of numbers, text or null;
// - rank_RRRRR.json names its rank, and holds the epoch, position, global offset and split size of every other
//   rank (a group steps in lockstep) and of state.json, and its generator's state in hex of the
//   size this LibTorch's CPU generator has.

#include <cstdint>
#include <filesystem>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <dtrain/checkpointer/files.hpp>
#include <dtrain/error.hpp>
#include <dtrain/metrics.hpp>
#include <dtrain/run_directory.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace checkpointer {

/// The largest count (iteration, epoch, position, steps, offset) a checkpoint may hold: 2^53, which
/// every JSON reader holds exactly, and far enough from 2^63 that no counter overflows.
inline constexpr std::int64_t max_count = std::int64_t{1} << 53;
/// The largest world size a checkpoint may name.
inline constexpr std::int64_t max_world_size = std::int64_t{1} << 24;
/// The manifest format this version writes and reads.
inline constexpr int manifest_format = 1;

namespace detail {

/// A checkpoint file whose content cannot be resumed from. what() begins with the file's name
/// (relative to the checkpoint) and names the field.
struct DamagedFile : Error {
  using Error::Error;
};

/// One JSON object of a checkpoint file, read field by field: each accessor throws DamagedFile
/// naming the file and the field (`prefix` + key) when the field is missing or not what it must be.
class Fields {
 public:
  Fields(std::string file, const nlohmann::json& j, std::string prefix = "");

  /// The JSON object in `dir / file`: DamagedFile when it cannot be read or is not JSON.
  static nlohmann::json parse(const std::filesystem::path& dir, const std::string& file);

  [[noreturn]] void fail(const std::string& key, const std::string& what) const;

  bool has(const std::string& key) const { return j_.contains(key); }

  const nlohmann::json& at(const std::string& key) const {
    if (!j_.contains(key)) fail(key, "is missing");
    return j_.at(key);
  }

  /// An integer in [lo, hi].
  std::int64_t integer(const std::string& key, std::int64_t lo, std::int64_t hi) const;

  std::string text(const std::string& key) const;

  /// A hex string (lower case, whole bytes) of `bytes` bytes; any length when `bytes` < 0.
  std::string hex(const std::string& key, std::int64_t bytes) const;

  /// An object of metric values (numbers, text, null), as report() and ctx.checkpoint's extras
  /// write them.
  Metrics metrics(const std::string& key) const;

 private:
  std::string file_;
  const nlohmann::json& j_;
  std::string prefix_;
};

/// One file of the manifest.
struct ManifestEntry {
  std::string name;
  std::uint64_t size = 0;
  std::uint32_t crc32 = 0;
};

/// manifest.json: every other file's size and CRC-32.
struct Manifest {
  std::int64_t iteration = 0;
  int world_size = 0;
  std::vector<ManifestEntry> files;

  static Manifest read(const std::filesystem::path& dir);
};

/// manifest.json of the checkpoint at `dir`, every field checked; a directory without one is an
/// unfinished write.
Manifest read_manifest(const std::filesystem::path& dir);

/// Throws DamagedFile unless every file `manifest` lists is in `dir` with its size and CRC-32, and
/// every record of each .pt file (a zip: torch::save, torch.save) matches its own CRC-32, which
/// LibTorch's reader does not check (a file changed and its manifest entry rewritten loads wrong).
void verify_files(const std::filesystem::path& dir, const Manifest& manifest);

/// Throws DamagedFile (naming `name`) unless the zip archive at `p` is whole: its central
/// directory readable and each stored record's data equal to its CRC-32.
void verify_zip_records(const std::filesystem::path& p, const std::string& name);

/// state.json: the counters, the reported metrics and the user's extras.
struct StateFile {
  std::int64_t iteration = 0, epoch = 0, position = 0, steps = 0;
  int world_size = 1;
  Metrics metrics, extras;

  static StateFile read(const std::filesystem::path& dir);
};

/// The size in bytes of this LibTorch's CPU generator state (what rank files hold in hex).
inline std::int64_t cpu_generator_state_bytes() {
  static const std::int64_t bytes = default_generator_state().numel();
  return bytes;
}

/// rank_RRRRR.json: one rank's sampler state and generators.
struct RankFile {
  int rank = 0;
  std::int64_t epoch = 0, position = 0, offset = -1;
  std::int64_t samples = -1;  // the size of the split the position belongs to (-1: not saved)
  std::string rng, cuda_rng;  // hex; cuda_rng empty when the rank trained on the CPU

  static RankFile read(const std::filesystem::path& dir, int rank);
};

/// Throws DamagedFile unless the files agree: with the directory's name (checkpoint_NNNNNN; a copy
/// under another name is taken at its word), with each other, and every rank with rank 0 (a
/// group steps in lockstep). `ranks` may be empty (another rank verified them).
void check_agreement(const std::filesystem::path& dir, const Manifest& m, const StateFile& s,
                     const std::vector<RankFile>& ranks);

}  // namespace detail

}  // namespace checkpointer

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/checkpointer/impl/state_files.ipp>
#endif
