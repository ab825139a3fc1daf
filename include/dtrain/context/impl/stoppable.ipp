// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of stoppable.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/context/stoppable.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace detail {

DTRAIN_INLINE epochs_until_stopped::epochs_until_stopped(std::int64_t first, std::int64_t last, std::function<void(std::int64_t)> begin,
                                                         std::function<bool()> stop)
    : first_(first), last_(last), begin_(std::move(begin)), stop_(std::move(stop)) {}
}  // namespace detail
DTRAIN_NAMESPACE_END
