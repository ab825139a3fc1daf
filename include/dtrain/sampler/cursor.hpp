// SPDX-License-Identifier: Apache-2.0
#pragma once
// EpochCursor: where a rank's train loop is in its epochs, and where a checkpoint resumes it.

#include <algorithm>
#include <cstdint>
#include <optional>
#include <utility>

#include <dtrain/version.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace sampler {

/// The current epoch, the batches of the Trainer's Sampler finished in it (the position a
/// checkpoint saves), and a pending resume: the first shard of the resumed epoch skips the batches
/// the checkpoint's epoch had consumed already. Shards with another Sampler do not move it.
///
/// A batch handed to the loop counts as finished once the loop trains on it (ctx.backward or
/// ctx.step while it is in hand) or takes the next one; a batch the loop `break`s out on before
/// training it is not counted, so the resumed epoch trains it.
class EpochCursor {
 public:
  /// Resumes at `epoch`, `position` batches into it; `offset`: the samples of the epoch's order
  /// all ranks together had trained (-1: unknown, a checkpoint from before offsets were saved).
  /// `redeal`: the worker count changed, so the epoch continues from `offset` (see continue_from).
  void resume(std::int64_t epoch, std::int64_t position, std::int64_t offset = -1, bool redeal = false);

  /// A shard of the Trainer's Sampler with `global_batch` samples a step (all ranks together)
  /// begins. Returns the sample offset to deal the rest of the resumed epoch from, when it must
  /// continue by offset rather than by skipping batches: under another worker count, or when the
  /// checkpoint's own epoch had been dealt from an offset. The shard then skips nothing.
  std::optional<std::int64_t> continue_from(std::int64_t global_batch);

  /// The epoch ctx.epochs(n) starts at: 0, or the resumed one.
  std::int64_t first_epoch() const { return first_epoch_; }
  std::int64_t epoch() const { return epoch_; }
  /// Batches of the Trainer's Sampler handed out so far in this epoch.
  std::int64_t position() const { return position_; }
  /// Whether the loop ended this epoch early (ctx.end_epoch()): a checkpoint resumes at the next.
  bool ended() const { return ended_; }
  /// Batches of the Trainer's Sampler in this epoch (0 before its first shard).
  std::int64_t epoch_batches() const { return epoch_batches_; }

  /// Epoch `e` begins: the resumed epoch keeps its position, any other starts at 0.
  void begin_epoch(std::int64_t e);

  /// A shard of the Trainer's Sampler with `n_batches` batches begins; returns how many of its
  /// first batches to skip (the resumed position, once).
  std::int64_t begin_shard(std::int64_t n_batches);

  /// Batch `index` of the current shard was handed to the loop: the ones before it are finished.
  void reached(std::int64_t index) {
    position_ = index;
    in_hand_ = index;
  }
  /// The loop trained on the batch in hand (a backward pass or an optimizer step).
  void trained() {
    if (in_hand_ >= 0) position_ = in_hand_ + 1;
  }
  /// The loop leaves the epoch early: whatever it did not train of it is not trained on resume.
  void end_epoch() { ended_ = true; }

  /// Where a checkpoint taken now resumes: (epoch, position); after an epoch's last batch, or
  /// once the loop ended the epoch, the next epoch's first.
  std::pair<std::int64_t, std::int64_t> resume_point() const;

  /// The epoch's global sample offset at resume_point(): the samples of its order all ranks
  /// together trained (0 at an epoch's start), which another worker count continues from; -1 when
  /// not known (no shard of this epoch yet, resumed from a checkpoint that saved no offset).
  std::int64_t resume_offset() const;

 private:
  std::int64_t first_epoch_ = 0, epoch_ = 0, position_ = 0, epoch_batches_ = 0, resume_position_ = 0;
  std::int64_t resume_offset_ = -1, base_ = 0, global_batch_ = 0;  // samples, all ranks together
  bool redeal_ = false;
  std::int64_t in_hand_ = -1;  // the batch handed to the loop and not yet known to be trained
  bool skip_pending_ = false, ended_ = false;
};

}  // namespace sampler

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/sampler/impl/cursor.ipp>
#endif
