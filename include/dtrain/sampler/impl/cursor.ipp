// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of cursor.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/sampler/cursor.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace sampler {

DTRAIN_INLINE void EpochCursor::resume(std::int64_t epoch, std::int64_t position, std::int64_t offset, bool redeal) {
  first_epoch_ = epoch_ = epoch;
  resume_position_ = position_ = position;
  resume_offset_ = offset;
  redeal_ = redeal;
  skip_pending_ = position > 0 || offset > 0;
  in_hand_ = -1;
}

DTRAIN_INLINE std::optional<std::int64_t> EpochCursor::continue_from(std::int64_t global_batch) {
  global_batch_ = global_batch;
  if (!skip_pending_ || resume_offset_ < 0) return std::nullopt;
  if (!redeal_ && resume_offset_ == resume_position_ * global_batch) return std::nullopt;
  base_ = resume_offset_;
  skip_pending_ = false;
  position_ = 0;
  return base_;
}

DTRAIN_INLINE void EpochCursor::begin_epoch(std::int64_t e) {
  epoch_ = e;
  epoch_batches_ = 0;
  in_hand_ = -1;
  ended_ = false;
  base_ = 0;
  if (skip_pending_ && e == first_epoch_) {
    position_ = resume_position_;
  } else {
    skip_pending_ = false;
    position_ = 0;
  }
}

DTRAIN_INLINE std::int64_t EpochCursor::begin_shard(std::int64_t n_batches) {
  epoch_batches_ = n_batches;
  in_hand_ = -1;
  std::int64_t skip = 0;
  if (skip_pending_) skip = std::min(position_, n_batches);
  else position_ = 0;
  skip_pending_ = false;
  return skip;
}

DTRAIN_INLINE std::pair<std::int64_t, std::int64_t> EpochCursor::resume_point() const {
  if (ended_ || (epoch_batches_ > 0 && position_ >= epoch_batches_)) return {epoch_ + 1, 0};
  return {epoch_, position_};
}

DTRAIN_INLINE std::int64_t EpochCursor::resume_offset() const {
  if (ended_ || (epoch_batches_ > 0 && position_ >= epoch_batches_)) return 0;  // the next epoch's start
  if (skip_pending_) return resume_offset_ >= 0 ? resume_offset_ : global_batch_ > 0 ? position_ * global_batch_ : -1;
  if (position_ > 0 && global_batch_ == 0) return -1;  // no shard yet: unknown
  return base_ + position_ * global_batch_;
}
}  // namespace sampler
DTRAIN_NAMESPACE_END
