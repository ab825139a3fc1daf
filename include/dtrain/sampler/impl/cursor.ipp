// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of cursor.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <algorithm>
#include <string>

#include <dtrain/error.hpp>
#include <dtrain/sampler/cursor.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace sampler {

DTRAIN_INLINE void EpochCursor::resume(std::int64_t epoch, std::int64_t position, std::int64_t offset, bool redeal,
                                       std::int64_t samples) {
  first_epoch_ = epoch_ = epoch;
  resume_position_ = position;
  resume_offset_ = offset;
  resume_samples_ = samples;
  redeal_ = redeal;
  check_resume_ = skip_pending_ = position > 0 || offset > 0;
  shards_.clear();
  training_ = resumed_ = in_hand_ = first_ = -1;
}

DTRAIN_INLINE EpochCursor::Shard* EpochCursor::find(std::int64_t id) {
  if (id < 0) return nullptr;
  for (auto it = shards_.rbegin(); it != shards_.rend(); ++it)
    if (it->id == id) return &*it;
  return nullptr;
}

DTRAIN_INLINE const EpochCursor::Shard* EpochCursor::main() const {
  if (const auto* t = find(training_)) return t;
  if (const auto* r = find(resumed_)) return r;
  return named_ || pending() ? nullptr : find(first_);
}

DTRAIN_INLINE std::int64_t EpochCursor::open(std::int64_t samples) {
  // A loop that begins a shard every step keeps a few: the training one, the resumed one, the
  // one in hand and the latest.
  constexpr std::size_t kept = 8;
  while (shards_.size() >= kept) {
    const auto old = std::find_if(shards_.begin(), shards_.end(), [this](const Shard& s) {
      return s.id != training_ && s.id != resumed_ && s.id != in_hand_ && s.id != first_;
    });
    if (old == shards_.end()) break;
    shards_.erase(old);
  }
  Shard s;
  s.id = next_id_++;
  s.samples = samples;
  if (first_ < 0) first_ = s.id;
  if (pending() && (resume_samples_ < 0 || resume_samples_ == samples)) {
    s.resumed = true;
    s.position = resume_position_;
    resumed_ = s.id;
    skip_pending_ = false;
  }
  shards_.push_back(s);
  return s.id;
}

DTRAIN_INLINE std::optional<std::int64_t> EpochCursor::continue_from(std::int64_t shard, std::int64_t global_batch) {
  Shard* s = find(shard);
  if (s == nullptr) return std::nullopt;
  s->global_batch = global_batch;
  if (!s->resumed || resume_offset_ < 0) return std::nullopt;
  if (!redeal_ && resume_offset_ == resume_position_ * global_batch) return std::nullopt;
  s->base = resume_offset_;
  s->position = 0;  // dealt from the offset: nothing to skip
  return s->base;
}

DTRAIN_INLINE std::int64_t EpochCursor::begin_shard(std::int64_t shard, std::int64_t n_batches) {
  Shard* s = find(shard);
  if (s == nullptr) return 0;
  s->batches = n_batches;
  s->in_hand = -1;
  s->position = std::min(s->position, n_batches);  // the resumed batches, else 0
  return s->position;
}

DTRAIN_INLINE void EpochCursor::begin_epoch(std::int64_t e) {
  epoch_ = e;
  ended_ = false;
  shards_.clear();
  training_ = resumed_ = in_hand_ = first_ = -1;
  if (e != first_epoch_) skip_pending_ = check_resume_ = false;
}

DTRAIN_INLINE std::int64_t EpochCursor::position() const {
  if (const auto* m = main()) return m->position;
  return pending() ? resume_position_ : 0;
}

DTRAIN_INLINE std::int64_t EpochCursor::epoch_batches() const {
  const auto* m = main();
  return m != nullptr ? m->batches : 0;
}

DTRAIN_INLINE void EpochCursor::reached(std::int64_t shard, std::int64_t index) {
  Shard* s = find(shard);
  if (s == nullptr) return;
  s->position = index;
  s->in_hand = index;
  in_hand_ = shard;
}

DTRAIN_INLINE void EpochCursor::trained() {
  Shard* s = find(in_hand_);
  if (s == nullptr) return;  // trained on batches of no shard of the Trainer's Sampler
  if (check_resume_) {
    check_resume_ = false;
    if (!s->resumed) {
      const Shard* went = find(resumed_);
      throw ConfigError(
          "dtrain: the checkpoint this run resumed from is " + std::to_string(resume_position_) +
          " batches into epoch " + std::to_string(first_epoch_) +
          (resume_samples_ >= 0 ? " of a split of " + std::to_string(resume_samples_) + " samples" : std::string()) +
          ", but the loop trains first on a shard of " + std::to_string(s->samples) + " samples" +
          (went != nullptr ? ", after an earlier shard of " + std::to_string(went->samples) +
                                 " samples took that position and skipped its first batches"
                           : ", and no shard of this epoch matched it") +
          ". Evaluate with ctx.shard(split, global_batch, dtrain::sampler::sequential{}), train on the split the "
          "checkpoint was trained on, or resume from a checkpoint at an epoch's end");
    }
  }
  training_ = s->id;
  named_ = true;
  if (s->in_hand >= 0) s->position = s->in_hand + 1;
}

DTRAIN_INLINE std::pair<std::int64_t, std::int64_t> EpochCursor::resume_point() const {
  if (ended_) return {epoch_ + 1, 0};
  if (const auto* m = main()) return at_end(*m) ? std::pair<std::int64_t, std::int64_t>{epoch_ + 1, 0}
                                                : std::pair<std::int64_t, std::int64_t>{epoch_, m->position};
  return {epoch_, pending() ? resume_position_ : 0};
}

DTRAIN_INLINE std::int64_t EpochCursor::resume_offset() const {
  if (ended_) return 0;  // the next epoch's start
  if (const auto* m = main()) {
    if (at_end(*m)) return 0;
    if (m->global_batch == 0) return m->position > 0 ? -1 : 0;
    return m->base + m->position * m->global_batch;
  }
  return pending() ? resume_offset_ : 0;
}

DTRAIN_INLINE std::int64_t EpochCursor::resume_samples() const {
  if (const auto* m = main()) return m->samples;
  return pending() ? resume_samples_ : -1;
}
}  // namespace sampler
DTRAIN_NAMESPACE_END
