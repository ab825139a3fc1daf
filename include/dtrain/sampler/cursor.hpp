// SPDX-License-Identifier: Apache-2.0
#pragma once
// EpochCursor: where a rank's train loop is in its epochs, and where a checkpoint resumes it.

#include <algorithm>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include <dtrain/version.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace sampler {

/// The current epoch, each shard of the Trainer's Sampler begun in it (its own position), and a
/// pending resume. Shards with another Sampler do not reach it.
///
/// The training shard of an epoch is the shard whose batch is in hand (the one handed out last)
/// when the loop calls ctx.backward or ctx.step; a checkpoint saves its position, and the size of
/// its split, whatever other shards (an evaluation, a prediction) the loop iterated since. Before
/// the loop trains in an epoch a checkpoint saves the epoch's start, or the resumed position. A
/// loop that trains without them (a plain `loss.backward()` and `opt.step()`) never names one: its
/// training shard is the resumed one, else the epoch's first (a loop that trains, then evaluates).
///
/// A batch handed to the loop counts as finished once the loop trains on it (ctx.backward or
/// ctx.step while it is in hand) or takes the next one of the same shard; a batch the loop
/// `break`s out on before training it is not counted, so the resumed epoch trains it.
///
/// A resumed position goes to the resumed epoch's first shard over a split of the saved size (any
/// shard, for a checkpoint that saved none). When the loop then trains first on another shard, the
/// position went astray (an evaluation over a split of the same size, another training split):
/// trained() throws Error rather than train the epoch's batches twice.
class EpochCursor {
 public:
  /// Resumes at `epoch`, `position` batches into it; `offset`: the samples of the epoch's order
  /// all ranks together had trained (-1: unknown, a checkpoint from before offsets were saved).
  /// `redeal`: the worker count changed, so the epoch continues from `offset` (see continue_from).
  /// `samples`: the size of the split the position belongs to (-1: not saved).
  void resume(std::int64_t epoch, std::int64_t position, std::int64_t offset = -1, bool redeal = false,
              std::int64_t samples = -1);

  /// A shard of the Trainer's Sampler over a split of `samples` samples begins; returns its id,
  /// which the calls below name. The resumed position goes to it when it is the one it came from.
  std::int64_t open(std::int64_t samples);

  /// Shard `shard` has `global_batch` samples a step (all ranks together). Returns the sample
  /// offset to deal the rest of the resumed epoch from, when it must continue by offset rather
  /// than by skipping batches: under another worker count, or when the checkpoint's own epoch had
  /// been dealt from an offset. The shard then skips nothing.
  std::optional<std::int64_t> continue_from(std::int64_t shard, std::int64_t global_batch);

  /// Shard `shard` has `n_batches` batches; returns how many of its first batches to skip (the
  /// resumed position, for the shard it went to).
  std::int64_t begin_shard(std::int64_t shard, std::int64_t n_batches);

  /// The epoch ctx.epochs(n) starts at: 0, or the resumed one.
  std::int64_t first_epoch() const { return first_epoch_; }
  std::int64_t epoch() const { return epoch_; }
  /// Batches of the training shard finished so far in this epoch (the resumed ones included).
  std::int64_t position() const;
  /// Whether the loop ended this epoch early (ctx.end_epoch()): a checkpoint resumes at the next.
  bool ended() const { return ended_; }
  /// Batches of the training shard in this epoch (0 before its first shard).
  std::int64_t epoch_batches() const;

  /// Epoch `e` begins: its shards start afresh; the resumed epoch keeps its pending position.
  void begin_epoch(std::int64_t e);

  /// Batch `index` of shard `shard` was handed to the loop: the ones before it are finished.
  void reached(std::int64_t shard, std::int64_t index);
  /// The loop trained on the batch in hand (a backward pass or an optimizer step): its shard is
  /// the training shard. Throws Error when the resumed position went to another shard.
  void trained();
  /// The loop leaves the epoch early: whatever it did not train of it is not trained on resume.
  void end_epoch() { ended_ = true; }

  /// Where a checkpoint taken now resumes: (epoch, position); after the training shard's last
  /// batch, or once the loop ended the epoch, the next epoch's first.
  std::pair<std::int64_t, std::int64_t> resume_point() const;

  /// The epoch's global sample offset at resume_point(): the samples of its order all ranks
  /// together trained (0 at an epoch's start), which another worker count continues from; -1 when
  /// not known (resumed from a checkpoint that saved no offset, before the shard it goes to).
  std::int64_t resume_offset() const;

  /// The size of the training shard's split, which a resume matches shards by (-1: not known).
  std::int64_t resume_samples() const;

 private:
  struct Shard {
    std::int64_t id = 0, samples = 0, batches = 0, position = 0, base = 0, global_batch = 0;
    std::int64_t in_hand = -1;  // the batch handed to the loop and not yet known to be trained
    bool resumed = false;       // the resumed position went to this shard
  };
  Shard* find(std::int64_t id);
  const Shard* find(std::int64_t id) const { return const_cast<EpochCursor*>(this)->find(id); }
  /// The training shard, else the one the resumed position went to, else the epoch's first;
  /// nullptr before any.
  const Shard* main() const;
  bool pending() const { return skip_pending_ && epoch_ == first_epoch_; }
  bool at_end(const Shard& s) const { return ended_ || (s.batches > 0 && s.position >= s.batches); }

  std::int64_t first_epoch_ = 0, epoch_ = 0;
  std::int64_t resume_position_ = 0, resume_offset_ = -1, resume_samples_ = -1;  // offsets: all ranks' samples
  bool redeal_ = false, skip_pending_ = false, ended_ = false;
  bool named_ = false;  // the loop has named a training shard (ctx.backward or ctx.step) in this run
  bool check_resume_ = false;  // the resumed epoch has not trained yet: check where its position went
  std::vector<Shard> shards_;  // this epoch's, the latest few and the training one
  std::int64_t next_id_ = 0, training_ = -1, resumed_ = -1, in_hand_ = -1, first_ = -1;  // shard ids
};

}  // namespace sampler

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/sampler/impl/cursor.ipp>
#endif
