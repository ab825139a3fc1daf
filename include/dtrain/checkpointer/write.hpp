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
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>
#include <torch/serialize/output-archive.h>
#include <torch/types.h>

#include <dtrain/checkpointer/files.hpp>
#include <dtrain/checkpointer/python_format.hpp>
#include <dtrain/error.hpp>
#include <dtrain/metrics.hpp>
#include <dtrain/run_directory.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace checkpointer {

/// A user object a checkpoint can hold: anything that writes its state into an OutputArchive
/// (a learning-rate scheduler, a tokenizer, precision::GradScaler). Checkpoint::load_object reads
/// it back through `load(torch::serialize::InputArchive&)`.
template <class T>
concept SavableState = requires(const T& t, torch::serialize::OutputArchive& archive) { t.save(archive); };

namespace detail {
/// What `object.save(archive)` writes, serialized.
inline std::string archive_bytes(const auto& object) {
  torch::serialize::OutputArchive archive;
  object.save(archive);
  std::ostringstream os;
  archive.save_to(os);
  return os.str();
}

/// Throws ConfigError unless `name` can be a file name in a checkpoint: letters, digits, '.', '_'
/// and '-', not starting with '.', at most 200 characters.
void check_user_name(const std::string& name, const char* call);
}  // namespace detail

/// What ctx.checkpoint(model, optimizer, extras) took on the training thread: clones, so the
/// training can go on while they are written. with_file() and with_object() add the user's state:
/// `ctx.checkpoint(model, opt).with_file("vocab.txt", path).with_object("scheduler", scheduler)`.
struct Snapshot {
  bool has_model = false;
  c10::Dict<std::string, at::Tensor> model;  // rank 0 only: the state is replicated
  std::string optimizer;                     // rank 0 only: the serialized OutputArchive
  /// Rank 0 under ddp<> with a known torch optimizer: optimizer.save()'s archive, over state
  /// tensors the optimizer no longer updates (renew_state_tensors); the writer serializes it.
  std::shared_ptr<torch::serialize::OutputArchive> optimizer_archive;
  bool sharded_optimizer = false;            // every rank's own optimizer state (strategy::fsdp<>)
  /// Rank 0, SGD/Adam/AdamW/RMSprop/Adagrad under ddp<>: optimizer_state.pt's dict for Python.
  std::optional<c10::IValue> python_optimizer;
  /// Rank 0: the Precision policy's state (amp's GradScaler), an OutputArchive; empty when none.
  std::string precision;
  /// Rank 0: model_config.json's text, for a model that describes itself (model_config.hpp).
  std::string model_config;
  /// Rank 0: adapter_config.json's text, for a model with LoRA adapters (nn/lora_layer.hpp).
  std::string adapter_config;
  /// Rank 0: the user's files (name -> bytes) and objects (name -> serialized OutputArchive).
  std::map<std::string, std::string> user_files, user_objects;
  Metrics extras;
  torch::Tensor generator;       // this rank's default CPU generator
  torch::Tensor cuda_generator;  // this rank's CUDA generator, when it trains on a GPU
  std::int64_t epoch = 0, position = 0, steps = 0;
  /// The epoch's global sample offset at `position` (all ranks' samples; -1 unknown): what a group
  /// of another worker count continues the epoch from.
  std::int64_t offset = -1;
  /// The size of the split `position` counts batches of (the training shard's; -1 unknown): a
  /// resume gives the position to a shard over a split of this size.
  std::int64_t samples = -1;

  /// Saves a copy of the file at `source` (read now) as `name` in the checkpoint, under files/,
  /// covered by the manifest; Checkpoint::file(name) gives its path back. The model's state is
  /// replicated, so rank 0's copy is the one saved (other ranks only check the name).
  Snapshot& with_file(const std::string& name, const std::filesystem::path& source) &;
  Snapshot&& with_file(const std::string& name, const std::filesystem::path& source) && {
    return std::move(with_file(name, source));
  }

  /// Saves `object`'s state (object.save(archive), now) as `name`; Checkpoint::load_object(name,
  /// object) loads it back. Rank 0's object is saved, as for the model.
  template <SavableState T>
  Snapshot& with_object(const std::string& name, const T& object) & {
    detail::check_user_name(name, "with_object");
    if (user_objects.count(name)) throw ConfigError("with_object: \"" + name + "\" is added twice to one checkpoint");
    if (!has_model) return *this;
    user_objects.emplace(name, detail::archive_bytes(object));
    return *this;
  }
  template <SavableState T>
  Snapshot&& with_object(const std::string& name, const T& object) && {
    return std::move(with_object(name, object));
  }
};

namespace detail {

inline std::string optimizer_bytes(const auto& optimizer) { return archive_bytes(optimizer); }

/// optimizer.pt of a checkpoint whose optimizer state is sharded: an archive that names the world
/// size, so that a plain optimizer.load() of it fails instead of loading something else.
std::string sharded_optimizer_marker(int world_size);

/// Writes this rank's file of checkpoint `iteration` into the temporary directory.
void write_rank_file(const std::filesystem::path& tmp, int rank, const Snapshot& s);

/// Rank 0's optional files: optimizer_state.pt (for Python), precision.pt, model_config.json, the user's files and
/// objects. `add(name, size, crc)` lists each in the manifest.
template <class Add>
void write_user_state(const std::filesystem::path& tmp, const Snapshot& s, Add&& add) {
  auto put = [&](const std::string& name, const std::string& bytes) {
    add(name, bytes.size(), write_file(tmp / name, bytes));
  };
  if (s.python_optimizer) {
    // Pickled from a shallow copy: torch's pickler memoizes a container referenced more than once,
    // so a user's copy of the Snapshot would otherwise change the file's bytes (not its values).
    const auto& state = *s.python_optimizer;
    put(files::python_optimizer, torch_save_bytes(state.isGenericDict() ? c10::IValue(state.toGenericDict().copy()) : state));
  }
  if (!s.precision.empty()) put(files::precision, s.precision);
  if (!s.model_config.empty()) put(files::model_config, s.model_config);
  if (!s.adapter_config.empty()) put(files::adapter_config, s.adapter_config);
  auto put_all = [&](const char* dir, const std::map<std::string, std::string>& named, const char* suffix) {
    if (named.empty()) return;
    std::error_code ec;
    std::filesystem::create_directory(tmp / dir, ec);
    if (ec) {
      errno = ec.value();
      io_error(tmp / dir, "create the directory");
    }
    for (const auto& [name, bytes] : named) put(std::string(dir) + "/" + name + suffix, bytes);
    fsync_directory(tmp / dir);
  };
  put_all(files::user_files, s.user_files, "");
  put_all(files::user_objects, s.user_objects, ".pt");
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
  // The torch.save format without type tags: Python's torch.load(weights_only=True) reads it.
  // On the CPU, so that the file loads on a machine without the GPU it was trained on.
  c10::Dict<std::string, at::Tensor> model_on_cpu;
  for (const auto& kv : s.model) model_on_cpu.insert(kv.key(), kv.value().cpu());
  const auto model = torch_save_bytes(c10::IValue(model_on_cpu));
  add(files::model, model.size(), write_file(tmp / files::model, model));
  write_user_state(tmp, s, add);
  // Optimizer state sharded per rank: optimizer.pt only says so, each rank's file holds its piece.
  std::string optimizer = s.sharded_optimizer ? sharded_optimizer_marker(world_size) : s.optimizer;
  if (s.optimizer_archive && !s.sharded_optimizer) {
    std::ostringstream os;
    s.optimizer_archive->save_to(os);
    optimizer = os.str();
  }
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

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/checkpointer/impl/write.ipp>
#endif
