// SPDX-License-Identifier: Apache-2.0
#pragma once
// Policy categories and the Policy concept.
//
// A policy is a type that names its category with a nested `using category = dtrain::category::X;`.
// Trainer<Model, Dataset, Policies...> sorts its policies by that name (policy/resolve.hpp); a type
// without it is not a policy and is rejected at compile time.

#include <type_traits>

#include <dtrain/version.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace category {
/// Collectives between workers: allreduce, broadcast, allgather, barrier (backend::gloo).
struct backend {};
/// Which sample indices each rank sees, epoch by epoch (sampler::distributed<>, sampler::sequential).
struct sampler {};
/// Where and whether checkpoints are written (checkpointer::none).
struct checkpointer {};
/// How the model is wrapped and its gradients synchronised (strategy::ddp<>, strategy::fsdp<>).
struct strategy {};
/// Numeric precision of forward and backward (precision::fp32, precision::amp<bf16>).
struct precision {};
/// What is recorded about a run besides its metrics history (tracker::directory, tracker::mlflow<>,
/// tracker::none).
struct tracker {};
}  // namespace category

namespace detail {
template <class C>
inline constexpr bool is_category =
    std::is_same_v<C, category::backend> || std::is_same_v<C, category::sampler> ||
    std::is_same_v<C, category::checkpointer> || std::is_same_v<C, category::strategy> ||
    std::is_same_v<C, category::precision> || std::is_same_v<C, category::tracker>;
}  // namespace detail

/// A dtrain policy: a type with a nested `category` naming one of dtrain::category's members.
template <class P>
concept Policy = requires { typename P::category; } && detail::is_category<typename P::category>;

/// A policy of category C.
template <class P, class C>
concept PolicyOf = Policy<P> && std::is_same_v<typename P::category, C>;

DTRAIN_NAMESPACE_END
