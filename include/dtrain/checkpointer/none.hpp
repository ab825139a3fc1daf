#pragma once
// checkpointer::none: no checkpoints are written; a run cannot resume.

#include <dtrain/policy/category.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace checkpointer {

/// Writes nothing. report(metrics) records metrics only; a failed run starts over.
struct none {
  using category = dtrain::category::checkpointer;
  static constexpr const char* name = "none";
  static constexpr bool persists = false;
};

}  // namespace checkpointer

DTRAIN_NAMESPACE_END
