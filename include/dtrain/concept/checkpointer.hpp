#pragma once
// The Checkpointer concept (moved verbatim from policy/concepts.hpp).

#include <concepts>

#include <dtrain/policy/category.hpp>

DTRAIN_NAMESPACE_BEGIN

/// Checkpointer. Minimal complete definition: `static constexpr bool persists`; optionally
/// `asynchronous` (write on a background thread; false when absent).
/// Laws: with persists, a checkpoint directory is complete (its manifest verifies) or absent, and
/// retention never removes the latest or the best one.
/// Models: checkpointer::directory<>, checkpointer::none.
template <class C>
concept CheckpointerPolicy = PolicyOf<C, category::checkpointer> && requires {
  { C::persists } -> std::convertible_to<bool>;
};

DTRAIN_NAMESPACE_END
