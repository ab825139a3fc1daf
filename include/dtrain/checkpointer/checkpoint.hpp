// SPDX-License-Identifier: Apache-2.0
#pragma once
// A checkpoint on disk: its layout, its manifest (sizes and CRC-32s), and the value type
// Checkpoint that finds, verifies and loads one.
//
// storage_path/name/checkpoint_NNNNNN/      NNNNNN: the report iteration, zero-padded
//   model.pt          parameters and buffers by name, a dict of tensors in torch.save's zip format
//                     without type tags (Python: torch.load("model.pt", weights_only=True))
//   optimizer.pt      the optimizer's state (torch::serialize::OutputArchive), read by C++
//   optimizer_state.pt  SGD/Adam/AdamW/RMSprop/Adagrad under ddp<>: Python's optimizer.state_dict()
//   precision.pt      amp's GradScaler state (loss scale, growth tracker), under loss scaling
//   model_config.json the model's type and construction config, when it has one (model_config.hpp)
//   files/NAME        the user's files (with_file); objects/NAME.pt the user's objects (with_object)
//   state.json        counters (iteration, epoch, steps), the reported metrics, the user's extras
//   rank_RRRRR.json   one per rank: its sampler position (and the epoch's global sample offset) and
//                     its default CPU generator's state
//   optimizer_rank_RRRRR.pt  under strategy::fsdp<> only: rank R's optimizer state (over its
//                     shards); optimizer.pt then only records that the state is sharded
//   manifest.json     every other file's size and CRC-32 (zlib), written last
//
// A checkpoint is written into `.tmp_checkpoint_NNNNNN` beside it, every file fsynced, then the
// directory is renamed into place and the run directory fsynced: a checkpoint_* directory is
// complete or absent, and the manifest catches what the disk damaged later.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/nn/module.h>
#include <torch/serialize/input-archive.h>
#include <torch/types.h>

#include <dtrain/checkpointer/files.hpp>
#include <dtrain/checkpointer/optimizer_options.hpp>
#include <dtrain/checkpointer/state_files.hpp>
#include <dtrain/error.hpp>
#include <dtrain/metrics.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace checkpointer {

/// How long checkpointing held up the training thread, and how long the writes took.
struct CheckpointStats {
  /// Checkpoints written (completed) by this rank.
  std::int64_t written = 0;
  /// Seconds the training thread spent in ctx.checkpoint() and in starting the write: waiting
  /// for the previous write, cloning the state, serializing the optimizer.
  double blocked_s = 0;
  /// Seconds the writes took on the background thread (all of them, and the last one).
  double write_s = 0, last_write_s = 0;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(CheckpointStats, written, blocked_s, write_s, last_write_s)



/// One checkpoint directory on disk: where it is, what was reported with it, and how to load it.
///
/// Obtained from Result::latest_checkpoint() / best_checkpoint() in the driver, or from
/// ctx.get_checkpoint() in a worker (where restore() also restores this rank's generator).
class Checkpoint {
 public:
  Checkpoint() = default;

  /// Opens the checkpoint at `dir` after verifying its manifest (every file's size and CRC-32)
  /// and every field of its JSON files (state_files.hpp: types, ranges, the files against each
  /// other); nothing when it is damaged or incomplete, with the reason in `*why`, which names the
  /// file and the field. `verify_files = false` skips the CRC-32s and the rank files (for a
  /// checkpoint another rank verified just now).
  static std::optional<Checkpoint> open(const std::filesystem::path& dir, std::string* why = nullptr,
                                        bool verify_files = true);

  /// Why the checkpoint at `dir` cannot be used, or "" when its manifest verifies (every field, and
  /// every file's size and CRC-32). open() also checks the JSON files' fields.
  static std::string verify(const std::filesystem::path& dir);

  const std::filesystem::path& path() const { return path_; }
  /// The metrics reported with this checkpoint (with iteration, epoch, step and timestamp).
  const Metrics& metrics() const { return metrics_; }
  /// The extras passed to ctx.checkpoint(model, optimizer, extras).
  const Metrics& extras() const { return extras_; }
  /// The extra `key` as a number. Error naming state.json and the key when the checkpoint has no
  /// such extra (give a fallback) or its value is not a number: a damaged checkpoint, which a
  /// group resuming from it (ctx.get_checkpoint()) passes over for an older one, as it does a
  /// checkpoint whose files do not load.
  double extra(std::string_view key) const;
  /// The extra `key` as a number, or `fallback` when the checkpoint has none (one written before
  /// the program saved that key); a value that is not a number is still a damaged checkpoint.
  double extra(std::string_view key, double fallback) const;
  /// The report() call that saved it (1 for the first report).
  std::int64_t iteration() const { return iteration_; }
  std::int64_t epoch() const { return epoch_; }
  /// Optimizer steps (ctx.step) taken before it was saved.
  std::int64_t steps() const { return steps_; }
  int world_size() const { return world_size_; }

  /// The model's parameters and buffers by name, as saved.
  std::map<std::string, torch::Tensor> model_state() const;

  /// Copies the saved parameters and buffers into `module` (a torch::nn::Module, its holder or a
  /// shared_ptr to one). Throws Error naming any name that is missing or has another shape.
  /// In a train loop, load the checkpoint ctx.get_checkpoint() gave through the context instead:
  /// `ctx.restore(*ck, model, optimizer)` (it loads through the Strategy and restores this rank's
  /// generator).
  template <class M>
  void load_model(M& module) const {
    refuse_in_worker("load_model(model)");
    check_adapter_base(as_module(module));
    load_tensors(as_module(module), model_state(), (path_ / files::model).string());
  }

  /// For a checkpoint of LoRA adapters (adapter_config.json): Error when `m` has no adapters, and
  /// ConfigError when the adapters were trained on another base than `m`'s (LoraConfig::base_model:
  /// the files' sizes and CRC-32s differ) or `m`'s adapters name no base while the checkpoint does.
  void check_adapter_base(const torch::nn::Module& m) const;

  /// Loads the saved optimizer state (saved whole, by strategy::ddp<>) into `optimizer`, built
  /// over the same parameters: the per-parameter state and every param group's options (lr,
  /// momentum, betas, weight decay, ...), which LibTorch's own optimizer.load() leaves as built.
  template <class Optimizer>
  void load_optimizer(Optimizer& optimizer) const {
    refuse_in_worker("load_optimizer(optimizer)");
    load_optimizer_of_rank(optimizer, -1, false);
  }

  /// The model and the optimizer as saved: `Checkpoint::open(dir)->restore(model, optimizer)`.
  template <class M, class Optimizer>
  void restore(M& module, Optimizer& optimizer) const {
    load_model(module);
    load_optimizer(optimizer);
  }
  /// The model alone, as saved (load_model).
  template <class M>
  void restore(M& module) const {
    load_model(module);
  }

  /// `tensors` copied by name into `m`'s parameters and buffers; `source` names them in errors.
  static void load_tensors(torch::nn::Module& m, const std::map<std::string, torch::Tensor>& tensors,
                           const std::string& source);

  /// The optimizer state rank `rank` loads: the whole state, or under strategy::fsdp<>
  /// (`sharded`) the rank's own piece, which needs the same world size. Sharded state into an
  /// optimizer over full parameters, or the reverse, throws ConfigError: the two do not convert.
  template <class Optimizer>
  void load_optimizer_of_rank(Optimizer& optimizer, int rank, bool sharded) const {
    const bool saved_sharded = optimizer_saved_sharded(sharded);
    std::filesystem::path file = path_ / files::optimizer;
    if (saved_sharded) {
      if (rank < 0 || rank >= world_size_)
        throw ConfigError(path_.string() + ": its optimizer state is sharded over " + std::to_string(world_size_) +
                          " ranks and this group's rank " + std::to_string(rank) +
                          " has no piece; resume with the same number of workers, or load the weights only "
                          "with ctx.restore(ck, model)");
      file = path_ / files::rank_optimizer(rank);
    }
    torch::serialize::InputArchive archive;
    archive.load_from(file.string());
    optimizer.load(archive);
    // LibTorch's load drops the saved param-group options (lr, momentum, betas, ...): set them.
    if constexpr (std::is_base_of_v<torch::optim::Optimizer, Optimizer>)
      detail::restore_group_options(optimizer, archive, file.string());
  }

  /// The files of optimizer state sharded over the ranks that saved it (strategy::fsdp<>), one per
  /// saved rank in rank order, for a group of another size to re-cut. Throws ConfigError when the
  /// state was saved whole (strategy::ddp<>).
  std::vector<std::filesystem::path> sharded_optimizer_files() const;

  /// Rank `rank`'s default CPU generator as saved; a no-op when the checkpoint was saved by a
  /// group without that rank.
  void restore_generator(int rank) const;

  /// The per-rank state (sampler epoch and position) `rank` saved, when it is there.
  std::optional<std::pair<std::int64_t, std::int64_t>> sampler_state(int rank) const;

  /// The epoch's global sample offset `rank` saved (the samples of the epoch all ranks together
  /// had trained), when it is there and known.
  std::optional<std::int64_t> sample_offset(int rank) const;

  /// The size of the split whose batches `rank`'s position counts (the training shard's), when it
  /// is there and known (checkpoints from before it was saved have none).
  std::optional<std::int64_t> shard_samples(int rank) const;

  /// The directory of the files saved with with_file(name, path), as Ray's as_directory(): read
  /// them there (it is absent when the checkpoint holds no user file).
  std::filesystem::path as_directory() const { return path_ / files::user_files; }

  /// The path of the file saved as `name` with with_file(). Throws Error naming the files the
  /// checkpoint holds when it has none of that name.
  std::filesystem::path file(const std::string& name) const;

  /// Whether the checkpoint holds an object saved as `name` with with_object().
  bool has_object(const std::string& name) const {
    std::error_code ec;
    return std::filesystem::is_regular_file(object_path(name), ec);
  }

  /// The type an object saved as `name` says it is (a preprocessor's "kind": "WordPieceTokenizer",
  /// "ViTImageProcessor", ...), so that a reader can restore it without being told; "" when the
  /// object records none. Throws Error as load_object does when there is no such object.
  std::string object_kind(const std::string& name) const;

  /// Loads the object saved as `name` with with_object(name, object) into `object`, through its
  /// `load(torch::serialize::InputArchive&)`. Throws Error naming the checkpoint's objects when it
  /// has none of that name, and the file when its load fails.
  template <class T>
    requires requires(T& t, torch::serialize::InputArchive& archive) { t.load(archive); }
  void load_object(const std::string& name, T& object) const {
    const auto p = object_path(name);
    require_object(name);
    try {
      torch::serialize::InputArchive archive;
      archive.load_from(p.string());
      object.load(archive);
    } catch (const c10::Error& e) {
      throw Error(p.string() + ": cannot load the object \"" + name + "\" (" + e.what_without_backtrace() +
                  "); was it saved by another type?");
    } catch (const DataError& e) {  // a preprocessor of another kind: its message names both
      throw DataError(p.string() + ": the object \"" + name + "\": " + e.what());
    }
  }

  /// Loads precision.pt into the Precision policy's state (`state.load(archive)`), when the
  /// checkpoint has one: a checkpoint saved without loss scaling leaves the state as it is.
  template <class PrecisionState>
  void load_precision(PrecisionState& state) const {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path_ / files::precision, ec)) return;
    torch::serialize::InputArchive archive;
    archive.load_from((path_ / files::precision).string());
    state.load(archive);
  }

  /// Rank `rank`'s CUDA generator on `device`, when the checkpoint saved one for that rank.
  void restore_device_generator(int rank, torch::Device device) const;

  /// Marks a checkpoint handed to a train loop (ctx.get_checkpoint()): its own load calls then
  /// refuse, naming ctx.restore, which also restores the rank's generator and loads through the
  /// Strategy; `damaged(why)` records the checkpoint as one to pass over when extra() finds a
  /// value that cannot be read.
  void mark_for_worker(std::function<void(const std::string&)> damaged = {}) {
    in_worker_ = true;
    damaged_ = std::move(damaged);
  }

 private:
  // Rank `rank`'s file, every field checked (open() checked it when the run chose this
  // checkpoint; an error here names the file that changed since).
  detail::RankFile rank_file(int rank) const;

  // Whether the optimizer state was saved sharded (per rank); ConfigError when that is not
  // `sharded`, what the loading optimizer is over: the two do not convert.
  // optimizer.pt's marker says so too when rank 0's file is missing.
  bool optimizer_saved_sharded(bool sharded) const;

  template <class M>
  static torch::nn::Module& as_module(M& m) {
    if constexpr (std::is_base_of_v<torch::nn::Module, M>) return m;
    else return static_cast<torch::nn::Module&>(*m);
  }

  std::filesystem::path object_path(const std::string& name) const {
    return path_ / files::user_objects / (name + ".pt");
  }

  // The names in the checkpoint's directory `dir` (without `suffix`), for error messages.
  std::string names_in(const char* dir, const std::string& suffix) const;
  // Error naming the objects there is when there is none called `name`.
  void require_object(const std::string& name) const;

  void refuse_in_worker(const char* call) const;

  std::filesystem::path path_;
  Metrics metrics_, extras_;
  std::int64_t iteration_ = 0, epoch_ = 0, steps_ = 0;
  int world_size_ = 1;
  bool in_worker_ = false;
  std::function<void(const std::string&)> damaged_;  // in a worker: marks the checkpoint to pass over
};

}  // namespace checkpointer

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/checkpointer/impl/checkpoint.ipp>
#endif
