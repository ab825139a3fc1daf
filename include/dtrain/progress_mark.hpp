// SPDX-License-Identifier: Apache-2.0
#pragma once
// This worker's progress counter: the training thread marks each point where it shows progress
// (a batch handed out, a collective issued or completed, a report), and the heartbeat's own thread
// publishes the count with its beat (launch/heartbeat.hpp). A rank whose count stands still while
// its heartbeat goes on is alive but stuck (FailureConfig::progress_timeout).
//
// One worker per process, so the counter is the process's: any layer marks it without being
// handed a Context. A mark is a few relaxed stores and one atomic increment, no store write.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>

#include <dtrain/version.hpp>

DTRAIN_NAMESPACE_BEGIN

/// Where this worker last showed progress.
struct ProgressPoint {
  std::int64_t count = 0;             // marks so far, labelled or not; 0: none yet
  const char* where = "nothing yet";  // the last labelled mark, of static storage duration
  std::int64_t number = -1;           // a number that goes with it (a batch, a report), -1: none
  std::int64_t after = 0;             // unlabelled marks (collectives issued or completed) since

  /// E.g. "batch #12 of an epoch (ctx.shard), then 3 collectives issued or completed".
  std::string describe() const;
};

namespace detail {
inline std::atomic<std::int64_t> progress_count{0};
inline std::atomic<const char*> progress_where{"nothing yet"};
inline std::atomic<std::int64_t> progress_number{-1};
inline std::atomic<std::int64_t> progress_labelled{0};  // the count at the last labelled mark

inline std::atomic<std::int64_t> collective_count{0};

/// An unlabelled mark: a collective issued or completed (collective.hpp's Work), which keeps the
/// last labelled point (the batch it belongs to) as the place to name.
inline void note_progress() noexcept { progress_count.fetch_add(1, std::memory_order_release); }
}  // namespace detail

/// Marks a point where this worker shows progress. `where` must live as long as the process (a
/// string literal); a '#' in it is followed by `number` when described ("report() call #").
/// The train loop may call it too, for a long stretch of its own with no batch, collective or
/// report (an evaluation over plain tensors), so that FailureConfig::progress_timeout sees it busy.
void mark_progress(const char* where, std::int64_t number = -1) noexcept;

/// Counts one collective issued through this process's communicator (backend::gloo's and
/// backend::nccl's public calls, the ones every rank issues in the same order). Each rank's
/// heartbeat publishes the count, so that a rank waiting at a group step (report, the end of the
/// loop) sees at once a peer that went past it issuing collectives (launch/group.hpp).
inline void note_collective_issued() noexcept { detail::collective_count.fetch_add(1, std::memory_order_release); }

/// Collectives issued through this process's communicator so far.
inline std::int64_t collectives_issued() noexcept { return detail::collective_count.load(std::memory_order_acquire); }

/// The last point marked. Read by another thread while marks go on, `where` and `number` may come
/// from neighbouring marks; once the worker stands still they are its last.
ProgressPoint last_progress() noexcept;

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/impl/progress_mark.ipp>
#endif
