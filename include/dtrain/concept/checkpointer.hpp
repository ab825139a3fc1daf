// SPDX-License-Identifier: Apache-2.0
#pragma once
// The Checkpointer concept: writing, verifying, retaining and finding checkpoints.

#include <concepts>
#include <cstdint>
#include <optional>

#include <dtrain/checkpointer/checkpoint.hpp>
#include <dtrain/checkpointer/write.hpp>
#include <dtrain/config.hpp>
#include <dtrain/launch/group.hpp>
#include <dtrain/policy/category.hpp>

DTRAIN_NAMESPACE_BEGIN

/// Checkpointer.
///
/// Minimal complete definition: `using category = dtrain::category::checkpointer;` and a nested
/// `state`, made once per worker group on every rank from `(const launch::Group&, const
/// RunConfig&)`, with every member checkpointer::none::state has (it documents each one and is
/// the template for a checkpointer of your own): `static constexpr bool persists`, `resumed()`,
/// `save(Snapshot&&, iteration, metrics)`, `wait()`, `best()`, `add_blocked(seconds)`, `stats()`,
/// `finish()`.
///
/// Optional members: none; a state has them all.
///
/// Laws (checked by tests/laws/checkpointer.hpp for every model that persists):
/// - round trip: after save(s, i, m) and wait() on every rank, a new group's state resumes from
///   checkpoint i, whose epoch, position, steps, metrics and extras are s's and m;
/// - atomic: a checkpoint directory is complete (its manifest verifies) or absent;
/// - retention never removes the latest checkpoint nor the best one by RunConfig::checkpoint;
/// - every rank's resumed() names the same checkpoint;
/// - a checkpoint whose state a resume cannot act on (a field of another type, out of range, or
///   disagreeing with another file: checkpointer/state_files.hpp) is passed over as damaged. The
///   ranks of one save are at one epoch, position and sample offset (a group steps in lockstep).
///
/// Models: checkpointer::directory<Async>, checkpointer::none.
template <class C>
concept CheckpointerPolicy =
    PolicyOf<C, category::checkpointer> &&
    std::constructible_from<typename C::state, const launch::Group&, const RunConfig&> &&
    requires(typename C::state& s, checkpointer::Snapshot&& snapshot, const Metrics& m) {
      { C::state::persists } -> std::convertible_to<bool>;
      { s.resumed() } -> std::convertible_to<const std::optional<checkpointer::Checkpoint>&>;
      s.save(std::move(snapshot), std::int64_t{1}, m);
      s.wait();
      { s.best() } -> std::convertible_to<std::optional<checkpointer::Checkpoint>>;
      s.add_blocked(0.0);
      { s.stats() } -> std::convertible_to<const checkpointer::CheckpointStats&>;
      s.finish();
    };

DTRAIN_NAMESPACE_END
