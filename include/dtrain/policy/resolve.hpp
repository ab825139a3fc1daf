// SPDX-License-Identifier: Apache-2.0
#pragma once
// Gathering a Trainer's policies into one compile-time map: category -> policy.

#include <type_traits>

#include <boost/hana/at_key.hpp>
#include <boost/hana/map.hpp>
#include <boost/hana/pair.hpp>
#include <boost/hana/type.hpp>
#include <boost/hana/union.hpp>

#include <dtrain/backend/gloo.hpp>
#include <dtrain/checkpointer/none.hpp>
#include <dtrain/policy/category.hpp>
#include <dtrain/policy/concepts.hpp>
#include <dtrain/precision/fp32.hpp>
#include <dtrain/sampler/distributed.hpp>
#include <dtrain/strategy/ddp.hpp>
#include <dtrain/tracker/directory.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace policy {

namespace hana = boost::hana;

/// What a Trainer uses for each category it is not given.
inline constexpr auto defaults = hana::make_map(
    hana::make_pair(hana::type_c<category::backend>, hana::type_c<backend::gloo>),
    hana::make_pair(hana::type_c<category::sampler>, hana::type_c<sampler::distributed<>>),
    hana::make_pair(hana::type_c<category::checkpointer>, hana::type_c<checkpointer::none>),
    hana::make_pair(hana::type_c<category::strategy>, hana::type_c<strategy::ddp<>>),
    hana::make_pair(hana::type_c<category::precision>, hana::type_c<precision::fp32>),
    hana::make_pair(hana::type_c<category::tracker>, hana::type_c<tracker::directory>));

namespace detail {

template <class P>
struct category_of {
  using type = void;
};
template <Policy P>
struct category_of<P> {
  using type = typename P::category;
};

template <class C, class... Ps>
inline constexpr int count = (0 + ... + int(std::is_same_v<typename category_of<Ps>::type, C>));

// Fires once per offending argument; the compiler prints the argument's type beside the message.
template <class P>
constexpr bool checked_is_policy() {
  static_assert(Policy<P>,
                "dtrain::Trainer<Model, Dataset, Policies...>: this argument is not a dtrain policy "
                "(it has no nested `using category = dtrain::category::<area>;`). Pass policies such as "
                "dtrain::backend::gloo, dtrain::sampler::distributed<>, dtrain::checkpointer::directory<>, "
                "dtrain::strategy::ddp<>, dtrain::strategy::fsdp<> or dtrain::precision::fp32; a policy of your own declares "
                "its category.");
  return Policy<P>;
}

// A backend whose build lacks what it needs (backend::nccl without CUDA) says `available = false`
// (concept/backend.hpp: backend_traits<B>::available).
template <class P>
constexpr bool checked_available() {
  if constexpr (std::is_same_v<typename category_of<P>::type, category::backend>) {
    static_assert(backend_traits<P>::available,
                  "dtrain::Trainer: backend::nccl needs a LibTorch built with CUDA and NCCL: build against "
                  "one (e.g. Python torch's, `-DCMAKE_PREFIX_PATH=$(python3 -c 'import torch; "
                  "print(torch.utils.cmake_prefix_path)')`) with the CUDA and NCCL headers on the include "
                  "path, or use dtrain::backend::gloo on CPU. See docs/gpu.md.");
    return backend_traits<P>::available;
  } else {
    return true;
  }
}

template <class... Ps>
constexpr bool checked_one_per_category() {
  static_assert(count<category::backend, Ps...> <= 1,
                "dtrain::Trainer: more than one Backend policy given; keep exactly one (backend::gloo or backend::nccl).");
  static_assert(count<category::sampler, Ps...> <= 1,
                "dtrain::Trainer: more than one Sampler policy given; keep exactly one "
                "(sampler::distributed<> or sampler::sequential).");
  static_assert(count<category::checkpointer, Ps...> <= 1,
                "dtrain::Trainer: more than one Checkpointer policy given; keep exactly one "
                "(checkpointer::directory<> or checkpointer::none).");
  static_assert(count<category::strategy, Ps...> <= 1,
                "dtrain::Trainer: more than one Strategy policy given; keep exactly one "
                "(strategy::ddp<> or strategy::fsdp<>).");
  static_assert(count<category::precision, Ps...> <= 1,
                "dtrain::Trainer: more than one Precision policy given; keep exactly one "
                "(precision::fp32, precision::amp<bf16> or precision::amp<fp16>).");
  static_assert(count<category::tracker, Ps...> <= 1,
                "dtrain::Trainer: more than one Tracker policy given; keep exactly one "
                "(tracker::directory, tracker::mlflow<>, tracker::tensorboard<> or tracker::none). "
                "tracker::mlflow<> writes tracker::directory's files too; for MLflow and TensorBoard "
                "both, write tracker::tensorboard<tracker::mlflow<>>.");
  return (count<category::backend, Ps...> <= 1) && (count<category::sampler, Ps...> <= 1) &&
         (count<category::checkpointer, Ps...> <= 1) && (count<category::strategy, Ps...> <= 1) &&
         (count<category::precision, Ps...> <= 1) && (count<category::tracker, Ps...> <= 1);
}

template <class... Ps>
auto gather() {
  return hana::union_(defaults,
                      hana::make_map(hana::make_pair(hana::type_c<typename Ps::category>, hana::type_c<Ps>)...));
}

template <bool Valid, class... Ps>
struct gathered {
  using type = decltype(gather<Ps...>());
};
template <class... Ps>
struct gathered<false, Ps...> {
  using type = decltype(gather<>());
};

template <class Map, class C>
using lookup = typename std::decay_t<decltype(hana::at_key(std::declval<Map>(), hana::type_c<C>))>::type;

}  // namespace detail

/// The resolved policies of a Trainer: one per category, the given ones over the defaults.
///
/// Rejected at compile time, each with a message naming the fix: an argument that is not a policy,
/// two policies of one category, and combinations that cannot work (see check_combination).
template <class... Ps>
struct set {
  static constexpr bool valid = (detail::checked_is_policy<Ps>() && ...) && detail::checked_one_per_category<Ps...>() &&
                                (detail::checked_available<Ps>() && ...);
  // Only a valid list is gathered, so a rejected one stops at the messages above.
  using map_type = typename detail::gathered<valid, Ps...>::type;
  using backend = detail::lookup<map_type, category::backend>;
  using sampler = detail::lookup<map_type, category::sampler>;
  using checkpointer = detail::lookup<map_type, category::checkpointer>;
  using strategy = detail::lookup<map_type, category::strategy>;
  using precision = detail::lookup<map_type, category::precision>;
  using tracker = detail::lookup<map_type, category::tracker>;

  // Each resolved policy provides what its category needs (dtrain/concept/<category>.hpp).
  static_assert(!valid || BackendPolicy<backend>,
                "dtrain::Trainer: the Backend policy lacks part of the BackendPolicy concept "
                "(uses_cuda, device(local_rank), a communicator with allreduce/broadcast/allgather/"
                "reduce_scatter/barrier); see "
                "dtrain/concept/backend.hpp");
  static_assert(!valid || SamplerPolicy<sampler>,
                "dtrain::Trainer: the Sampler policy lacks `static std::vector<std::int64_t> indices(n, "
                "rank, world_size, epoch)`; see dtrain/concept/sampler.hpp");
  static_assert(!valid || CheckpointerPolicy<checkpointer>,
                "dtrain::Trainer: the Checkpointer policy lacks a nested `state` with every member of "
                "checkpointer::none::state (built from (const launch::Group&, const RunConfig&)); copy "
                "checkpointer::none::state as the template, see dtrain/concept/checkpointer.hpp");
  static_assert(!valid || StrategyPolicy<strategy>,
                "dtrain::Trainer: the Strategy policy lacks a nested `template <class Communicator> class "
                "state` built from (torch::nn::Module&, Communicator&) with set_sync(bool), using no more of the communicator than the Backend concept "
                "promises; see dtrain/concept/strategy.hpp");
  static_assert(!valid || PrecisionPolicy<precision>,
                "dtrain::Trainer: the Precision policy lacks `requires_cuda` or a nested `state` built "
                "from torch::Device with autocast(), backward(loss) and step(optimizer) (and, with loss_scaling, "
                "skipped_steps() and loss_scale()); see dtrain/concept/precision.hpp");
  static_assert(!valid || TrackerPolicy<tracker>,
                "dtrain::Trainer: the Tracker policy lacks `static void start(const "
                "dtrain::tracking::RunRecord&)` or `static void end(const dtrain::tracking::RunRecord&)`; "
                "see dtrain/concept/tracker.hpp");

  /// Combinations of individually valid policies that cannot work together.
  static constexpr bool check_combination() {
    static_assert(!valid || !precision::requires_cuda || backend::uses_cuda,
                  "dtrain::Trainer: precision::amp<fp16> needs CUDA autocast and loss scaling, and "
                  "this backend runs on CPU, where LibTorch has no fp16 autocast. Use "
                  "precision::amp<bf16> on CPU (or precision::fp32), or backend::nccl on GPUs.");
    return true;
  }
  static_assert(check_combination());
};

}  // namespace policy

DTRAIN_NAMESPACE_END
