// policy/: the Policy concept and how policy::set<> resolves a Trainer's policies over the defaults.
// Lists that must not compile are tested in tests/compile; everything here compiles.

#include <type_traits>

#include <dtrain/backend/gloo.hpp>
#include <dtrain/checkpointer/none.hpp>
#include <dtrain/policy/category.hpp>
#include <dtrain/policy/resolve.hpp>
#include <dtrain/precision/amp.hpp>
#include <dtrain/precision/fp32.hpp>
#include <dtrain/sampler/distributed.hpp>
#include <dtrain/sampler/sequential.hpp>
#include <dtrain/strategy/ddp.hpp>
#include <dtrain/tracker/mlflow.hpp>
#include <dtrain/tracker/none.hpp>

#include <torch/torch.h>

#include "support.hpp"

namespace {

namespace d = dtrain;

struct no_category {};
struct foreign_category {
  using category = int;
};
struct user_checkpointer {
  using category = dtrain::category::checkpointer;
  static constexpr bool persists = true;
};

using shuffled_drop = d::sampler::distributed<7, true, d::sampler::tail::drop>;
using small_buckets = d::strategy::ddp<1024, 4096>;

/// True when set<Ps...> resolved every category as named.
template <class Set, class Backend, class Sampler, class Checkpointer, class Strategy, class Precision>
constexpr bool resolves_to =
    std::is_same_v<typename Set::backend, Backend> && std::is_same_v<typename Set::sampler, Sampler> &&
    std::is_same_v<typename Set::checkpointer, Checkpointer> &&
    std::is_same_v<typename Set::strategy, Strategy> && std::is_same_v<typename Set::precision, Precision>;

}  // namespace

TEST_CASE("policy::set<> resolves every category to its default", "[policy]") {
  using S = d::policy::set<>;
  STATIC_REQUIRE(S::valid);
  STATIC_REQUIRE(std::is_same_v<S::backend, d::backend::gloo>);
  STATIC_REQUIRE(std::is_same_v<S::sampler, d::sampler::distributed<>>);
  STATIC_REQUIRE(std::is_same_v<S::checkpointer, d::checkpointer::none>);
  STATIC_REQUIRE(std::is_same_v<S::strategy, d::strategy::ddp<>>);
  STATIC_REQUIRE(std::is_same_v<S::precision, d::precision::fp32>);
}

TEST_CASE("policy::set<P> overrides P's category and keeps the other defaults", "[policy]") {
  STATIC_REQUIRE(resolves_to<d::policy::set<d::sampler::sequential>, d::backend::gloo, d::sampler::sequential,
                             d::checkpointer::none, d::strategy::ddp<>, d::precision::fp32>);
  STATIC_REQUIRE(resolves_to<d::policy::set<d::precision::amp<d::precision::bf16>>, d::backend::gloo,
                             d::sampler::distributed<>, d::checkpointer::none, d::strategy::ddp<>,
                             d::precision::amp<d::precision::bf16>>);
  STATIC_REQUIRE(resolves_to<d::policy::set<small_buckets>, d::backend::gloo, d::sampler::distributed<>,
                             d::checkpointer::none, small_buckets, d::precision::fp32>);
  STATIC_REQUIRE(resolves_to<d::policy::set<d::backend::gloo_with_threads<4>>, d::backend::gloo_with_threads<4>,
                             d::sampler::distributed<>, d::checkpointer::none, d::strategy::ddp<>,
                             d::precision::fp32>);
  // A default given explicitly changes nothing.
  STATIC_REQUIRE(resolves_to<d::policy::set<d::backend::gloo, d::precision::fp32>, d::backend::gloo,
                             d::sampler::distributed<>, d::checkpointer::none, d::strategy::ddp<>,
                             d::precision::fp32>);
}

TEST_CASE("policy::set resolves the same whatever the order of its policies", "[policy]") {
  using bf16 = d::precision::amp<d::precision::bf16>;
  using A = d::policy::set<shuffled_drop, bf16, small_buckets>;
  using B = d::policy::set<small_buckets, shuffled_drop, bf16>;
  using C = d::policy::set<bf16, small_buckets, shuffled_drop>;
  STATIC_REQUIRE(resolves_to<A, d::backend::gloo, shuffled_drop, d::checkpointer::none, small_buckets, bf16>);
  STATIC_REQUIRE(resolves_to<B, d::backend::gloo, shuffled_drop, d::checkpointer::none, small_buckets, bf16>);
  STATIC_REQUIRE(resolves_to<C, d::backend::gloo, shuffled_drop, d::checkpointer::none, small_buckets, bf16>);

  using All = d::policy::set<d::precision::fp32, user_checkpointer, d::sampler::sequential,
                             d::backend::gloo_with_threads<1>, small_buckets>;
  STATIC_REQUIRE(resolves_to<All, d::backend::gloo_with_threads<1>, d::sampler::sequential,
                             user_checkpointer, small_buckets, d::precision::fp32>);
}

TEST_CASE("policy::set takes a user's own policy that declares its category", "[policy]") {
  STATIC_REQUIRE(std::is_same_v<d::policy::set<user_checkpointer>::checkpointer, user_checkpointer>);
  STATIC_REQUIRE(std::is_same_v<d::policy::set<user_checkpointer>::sampler, d::sampler::distributed<>>);
}

TEST_CASE("The Policy concept accepts dtrain's policies", "[policy]") {
  STATIC_REQUIRE(d::Policy<d::backend::gloo>);
  STATIC_REQUIRE(d::Policy<d::backend::gloo_with_threads<3>>);
  STATIC_REQUIRE(d::Policy<d::sampler::distributed<>>);
  STATIC_REQUIRE(d::Policy<shuffled_drop>);
  STATIC_REQUIRE(d::Policy<d::sampler::sequential>);
  STATIC_REQUIRE(d::Policy<d::checkpointer::none>);
  STATIC_REQUIRE(d::Policy<d::strategy::ddp<>>);
  STATIC_REQUIRE(d::Policy<d::precision::fp32>);
  STATIC_REQUIRE(d::Policy<d::precision::amp<d::precision::bf16>>);
  STATIC_REQUIRE(d::Policy<user_checkpointer>);
}

TEST_CASE("The Policy concept rejects types that do not declare a dtrain category", "[policy]") {
  STATIC_REQUIRE_FALSE(d::Policy<int>);
  STATIC_REQUIRE_FALSE(d::Policy<no_category>);
  STATIC_REQUIRE_FALSE(d::Policy<foreign_category>);
  STATIC_REQUIRE_FALSE(d::Policy<d::category::sampler>);  // a category is not a policy of itself
}

TEST_CASE("PolicyOf<P, C> holds only for C = P's category", "[policy]") {
  STATIC_REQUIRE(d::PolicyOf<d::sampler::sequential, d::category::sampler>);
  STATIC_REQUIRE(d::PolicyOf<d::sampler::distributed<>, d::category::sampler>);
  STATIC_REQUIRE(d::PolicyOf<d::backend::gloo, d::category::backend>);
  STATIC_REQUIRE(d::PolicyOf<d::precision::amp<d::precision::bf16>, d::category::precision>);
  STATIC_REQUIRE_FALSE(d::PolicyOf<d::sampler::sequential, d::category::backend>);
  STATIC_REQUIRE_FALSE(d::PolicyOf<d::checkpointer::none, d::category::strategy>);
  STATIC_REQUIRE_FALSE(d::PolicyOf<int, d::category::sampler>);
}

TEST_CASE("every policy models its category's concept", "[policy][concepts]") {
  STATIC_REQUIRE(dtrain::BackendPolicy<dtrain::backend::gloo>);
  STATIC_REQUIRE(dtrain::BackendPolicy<dtrain::backend::gloo_with_threads<4>>);
  STATIC_REQUIRE(dtrain::SamplerPolicy<dtrain::sampler::distributed<>>);
  STATIC_REQUIRE(dtrain::SamplerPolicy<dtrain::sampler::distributed<7, false, dtrain::sampler::tail::drop>>);
  STATIC_REQUIRE(dtrain::SamplerPolicy<dtrain::sampler::sequential>);
  STATIC_REQUIRE(dtrain::CheckpointerPolicy<dtrain::checkpointer::none>);
  STATIC_REQUIRE(dtrain::StrategyPolicy<dtrain::strategy::ddp<>>);
  STATIC_REQUIRE(dtrain::PrecisionPolicy<dtrain::precision::fp32>);
  STATIC_REQUIRE(dtrain::PrecisionPolicy<dtrain::precision::amp<dtrain::precision::bf16>>);
  STATIC_REQUIRE(dtrain::TrackerPolicy<dtrain::tracker::directory>);
  STATIC_REQUIRE(dtrain::TrackerPolicy<dtrain::tracker::mlflow<>>);
  STATIC_REQUIRE(dtrain::TrackerPolicy<dtrain::tracker::none>);
  STATIC_REQUIRE(std::is_same_v<d::policy::set<>::tracker, d::tracker::directory>);
  STATIC_REQUIRE(std::is_same_v<d::policy::set<d::tracker::mlflow<2>, d::precision::fp32>::tracker, d::tracker::mlflow<2>>);
  STATIC_REQUIRE_FALSE(dtrain::TrackerPolicy<dtrain::checkpointer::none>);
  // A policy of one category does not model another's concept.
  STATIC_REQUIRE_FALSE(dtrain::SamplerPolicy<dtrain::backend::gloo>);
  STATIC_REQUIRE_FALSE(dtrain::BackendPolicy<dtrain::sampler::sequential>);
}

TEST_CASE("precision::amp<bf16> autocasts inside its scope only, and training still learns", "[precision]") {
  using amp = dtrain::precision::amp<dtrain::precision::bf16>;
  amp::state state(torch::kCPU);
  torch::manual_seed(0);
  torch::nn::Linear layer(8, 4);
  const auto x = torch::randn({16, 8});
  {
    auto scope = state.autocast();
    CHECK(layer->forward(x).scalar_type() == torch::kBFloat16);
    {
      auto inner = state.autocast();  // nesting keeps autocast on
      CHECK(layer->forward(x).scalar_type() == torch::kBFloat16);
    }
    CHECK(layer->forward(x).scalar_type() == torch::kBFloat16);
  }
  CHECK(layer->forward(x).scalar_type() == torch::kFloat);

  // A few bf16 steps reduce the loss much as fp32 steps do; parameters stay fp32.
  const auto target = torch::randn({16, 4});
  torch::optim::SGD sgd(layer->parameters(), 0.1);
  double first = 0, last = 0;
  for (int i = 0; i < 20; ++i) {
    sgd.zero_grad();
    torch::Tensor loss;
    {
      auto scope = state.autocast();
      loss = torch::mse_loss(layer->forward(x).to(torch::kFloat), target);
    }
    state.backward(loss);
    CHECK(state.step(sgd));
    (i == 0 ? first : last) = loss.item<double>();
  }
  CHECK(last < 0.8 * first);
  CHECK(layer->weight.scalar_type() == torch::kFloat);
}

TEST_CASE("precision::amp<bf16> on a CUDA device is refused with a clear error", "[precision]") {
  using amp = dtrain::precision::amp<dtrain::precision::bf16>;
  CHECK_THROWS_WITH(amp::state(torch::Device(torch::kCUDA, 0)), Catch::Contains("autocasts on CPU only"));
}
