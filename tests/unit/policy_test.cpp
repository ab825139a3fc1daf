// SPDX-License-Identifier: Apache-2.0
// policy/: the Policy concept and how policy::set<> resolves a Trainer's policies over the defaults.
// Lists that must not compile are tested in tests/compile; everything here compiles.

#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include <dtrain/backend/gloo.hpp>
#include <dtrain/backend/nccl.hpp>
#include <dtrain/checkpointer/none.hpp>
#include <dtrain/concept/archetypes.hpp>
#include <dtrain/policy/concepts.hpp>
#include <dtrain/policy/category.hpp>
#include <dtrain/policy/resolve.hpp>
#include <dtrain/precision/amp.hpp>
#include <dtrain/precision/dense_gradients.hpp>
#include <dtrain/precision/fp32.hpp>
#include <dtrain/precision/grad_scaler.hpp>
#include <dtrain/precision/optimizer_step.hpp>
#include <dtrain/sampler/distributed.hpp>
#include <dtrain/sampler/sequential.hpp>
#include <dtrain/strategy/ddp.hpp>
#include <dtrain/strategy/fsdp.hpp>
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
// A checkpointer of one's own, started from the template checkpointer::none::state spells out.
struct user_checkpointer {
  using category = dtrain::category::checkpointer;
  struct state : dtrain::checkpointer::none::state {
    using dtrain::checkpointer::none::state::state;
  };
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

TEST_CASE("backend::nccl is a backend policy, available exactly when the build has CUDA and NCCL", "[policy][nccl]") {
  STATIC_REQUIRE(d::PolicyOf<d::backend::nccl, d::category::backend>);
  STATIC_REQUIRE(d::backend::nccl::uses_cuda);
  STATIC_REQUIRE(d::backend::nccl::available == bool(DTRAIN_WITH_CUDA));
#if DTRAIN_WITH_CUDA
  STATIC_REQUIRE(d::BackendPolicy<d::backend::nccl>);
  STATIC_REQUIRE(resolves_to<d::policy::set<d::backend::nccl, d::precision::amp<d::precision::fp16>>, d::backend::nccl,
                             d::sampler::distributed<>, d::checkpointer::none, d::strategy::ddp<>,
                             d::precision::amp<d::precision::fp16>>);
#endif
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
  STATIC_REQUIRE(dtrain::StrategyPolicy<dtrain::strategy::fsdp<>>);
  STATIC_REQUIRE(dtrain::StrategyPolicy<dtrain::strategy::fsdp<dtrain::strategy::sharding::shard_grad_op,
                                                                dtrain::strategy::wrap::whole_model>>);
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

TEST_CASE("each concept accepts its archetype, and the archetypes belong to no other concept", "[policy][concepts]") {
  // An archetype has exactly the concept's minimal complete definition: a concept that asked for
  // more would reject it.
  STATIC_REQUIRE(d::BackendPolicy<d::archetype::backend>);
  STATIC_REQUIRE(d::StrategyPolicy<d::archetype::strategy>);
  STATIC_REQUIRE(d::PrecisionPolicy<d::archetype::precision>);
  STATIC_REQUIRE_FALSE(d::StrategyPolicy<d::archetype::backend>);
  STATIC_REQUIRE_FALSE(d::PrecisionPolicy<d::archetype::strategy>);
  STATIC_REQUIRE_FALSE(d::BackendPolicy<d::archetype::precision>);
  // dtrain's strategies and precisions use no more of a communicator than the archetype has.
  STATIC_REQUIRE(std::is_constructible_v<d::strategy::ddp<>::state<d::archetype::communicator>, torch::nn::Module&,
                                         d::archetype::communicator&>);
  STATIC_REQUIRE(std::is_constructible_v<d::strategy::fsdp<>::state<d::archetype::communicator>, torch::nn::Module&,
                                         d::archetype::communicator&>);
  STATIC_REQUIRE(std::is_constructible_v<d::precision::amp<d::precision::bf16>::state, torch::Device,
                                         d::archetype::communicator&>);
}

namespace {
// A precision that scales the loss but does not say how many steps it skipped: rejected, since
// the metrics rows report both.
struct scaling_without_counts {
  using category = dtrain::category::precision;
  static constexpr bool requires_cuda = false;
  // fp32's state, claiming loss scaling.
  struct state : dtrain::precision::fp32::state {
    using dtrain::precision::fp32::state::state;
    static constexpr bool loss_scaling = true;
  };
};
}  // namespace

TEST_CASE("the traits give every optional member its documented default", "[policy][concepts]") {
  // Backend: available unless it says otherwise; a batch transfer only where named.
  STATIC_REQUIRE(d::backend_traits<d::archetype::backend>::available);
  STATIC_REQUIRE_FALSE(d::backend_traits<d::archetype::backend>::has_batch_transfer);
  STATIC_REQUIRE_FALSE(d::backend_traits<d::backend::gloo>::has_batch_transfer);
  STATIC_REQUIRE(d::backend_traits<d::backend::nccl>::available == bool(DTRAIN_WITH_CUDA));
  STATIC_REQUIRE(d::backend_traits<d::backend::nccl>::has_batch_transfer == bool(DTRAIN_WITH_CUDA));

  // Strategy: only fsdp<> shards the optimizer.
  STATIC_REQUIRE_FALSE(d::strategy_traits<d::archetype::strategy>::shards_optimizer);
  STATIC_REQUIRE_FALSE(d::strategy_traits<d::strategy::ddp<>>::shards_optimizer);
  STATIC_REQUIRE(d::strategy_traits<d::strategy::fsdp<>>::shards_optimizer);

  // Precision: fp32 and amp<bf16> do not scale the loss, so nothing is skipped and the scale is 1.
  using fp32 = d::precision_traits<d::precision::fp32>;
  using bf16 = d::precision_traits<d::precision::amp<d::precision::bf16>>;
  STATIC_REQUIRE_FALSE(fp32::loss_scaling);
  STATIC_REQUIRE_FALSE(bf16::loss_scaling);
  d::precision::fp32::state s(torch::kCPU);
  CHECK(fp32::skipped_steps(s) == 0);
  CHECK(fp32::loss_scale(s) == 1.0);
  STATIC_REQUIRE(d::PrecisionPolicy<d::precision::amp<d::precision::bf16, d::precision::dynamic_loss_scale>>);
  STATIC_REQUIRE(d::precision_traits<d::precision::amp<d::precision::bf16, d::precision::dynamic_loss_scale>>::loss_scaling);
  STATIC_REQUIRE_FALSE(d::PrecisionPolicy<scaling_without_counts>);
}

TEST_CASE("strategy_traits' defaults act on the module itself under a strategy without the members", "[policy][concepts]") {
  // ddp<> leaves the model whole: every default below reads the module.
  using traits = d::strategy_traits<d::strategy::ddp<>>;
  torch::nn::Linear layer(3, 2);
  struct bare {};  // a state with no optional member
  bare s;
  auto& m = static_cast<torch::nn::Module&>(*layer);
  CHECK(traits::parameters(s, m).size() == 2);
  CHECK(traits::forward(s, [] { return 7; }) == 7);
  CHECK(traits::held_bytes(s, m) == (3 * 2 + 2) * 4);  // no gradients yet
  CHECK(traits::full_state(s, m, 0).size() == 2);
  CHECK(traits::full_state(s, m, 1).size() == 0);
  CHECK_FALSE(traits::load_full_state(s, {}, "nowhere"));
  traits::check_optimizer(s, layer->parameters());  // any optimizer is fine
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

TEST_CASE("precision::amp on a CUDA device without CUDA is refused with a clear error", "[precision]") {
  if (torch::cuda::is_available()) return;  // a CUDA build: tests/gpu covers it
  using amp = dtrain::precision::amp<dtrain::precision::bf16>;
  CHECK_THROWS_WITH(amp::state(torch::Device(torch::kCUDA, 0)),
                    Catch::Contains("this LibTorch has no CUDA") && Catch::Contains("backend::nccl"));
}

TEST_CASE("precision::amp<fp16> on CPU is refused where LibTorch cannot autocast CPU code to fp16", "[precision]") {
  using amp = dtrain::precision::amp<dtrain::precision::fp16>;
  STATIC_REQUIRE(amp::state::loss_scaling);  // fp16 scales its loss by default; bf16 does not
  STATIC_REQUIRE_FALSE(dtrain::precision::amp<dtrain::precision::bf16>::state::loss_scaling);
  if (dtrain::compat::cpu_autocasts_fp16) return;
  CHECK_THROWS_WITH(amp::state(torch::kCPU), Catch::Contains("bf16 only") && Catch::Contains("amp<bf16>"));
}

// --- GradScaler: dynamic loss scaling, tested on CPU in fp32 (its composite path) ----------------

namespace {
namespace p = dtrain::precision;

struct scaled_fixture {
  torch::nn::Linear layer{4, 3};
  torch::Tensor x = torch::randn({8, 4}), y = torch::randn({8, 3});
  scaled_fixture() { torch::manual_seed(3); layer = torch::nn::Linear(4, 3); }
  torch::Tensor loss() { return torch::mse_loss(layer->forward(x), y); }
  std::vector<torch::Tensor> params() const {
    std::vector<torch::Tensor> v;
    for (const auto& t : layer->parameters()) v.push_back(t.detach().clone());
    return v;
  }
};

bool same(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!torch::equal(a[i], b[i])) return false;
  return true;
}
}  // namespace

TEST_CASE("GradScaler: PyTorch's defaults, and bad options are refused", "[precision][scaler]") {
  p::GradScaler scaler(torch::kCPU);
  CHECK(scaler.scale_value() == 65536.0);
  CHECK(scaler.options().growth_factor == 2.0);
  CHECK(scaler.options().backoff_factor == 0.5);
  CHECK(scaler.options().growth_interval == 2000);
  CHECK(scaler.scale(torch::ones({1})).item<double>() == 65536.0);
  CHECK_THROWS_WITH(p::GradScaler(torch::kCPU, {.backoff_factor = 1.5}), Catch::Contains("backoff_factor"));
  CHECK_THROWS_WITH(p::GradScaler(torch::kCPU, {.growth_interval = 0}), Catch::Contains("growth_interval"));
  CHECK_THROWS_WITH(p::GradScaler(torch::kCPU, {.init_scale = -1}), Catch::Contains("init_scale"));
}

TEST_CASE("GradScaler: the unscaled gradients equal fp32's", "[precision][scaler]") {
  scaled_fixture f;
  f.loss().backward();
  std::vector<torch::Tensor> fp32_grads;
  for (auto& q : f.layer->parameters()) fp32_grads.push_back(q.grad().clone());
  f.layer->zero_grad();

  p::GradScaler scaler(torch::kCPU);
  scaler.scale(f.loss()).backward();
  torch::optim::SGD sgd(f.layer->parameters(), 0.1);
  CHECK_FALSE(scaler.unscale(sgd));
  std::size_t i = 0;
  for (auto& q : f.layer->parameters()) CHECK(torch::allclose(q.grad(), fp32_grads[i++], 1e-5, 1e-7));
  // step() after unscale() does not divide a second time: the step is fp32's step.
  const auto before = f.params();
  CHECK(scaler.step(sgd));
  i = 0;
  for (auto& q : f.layer->parameters()) {
    CHECK(torch::allclose(q.detach(), before[i] - 0.1 * fp32_grads[i], 1e-5, 1e-7));
    ++i;
  }
}

TEST_CASE("GradScaler: an inf gradient skips the step, halves the scale and counts the skip", "[precision][scaler]") {
  for (float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    scaled_fixture f;
    p::GradScaler scaler(torch::kCPU);
    torch::optim::SGD sgd(f.layer->parameters(), 0.1);
    scaler.scale(f.loss()).backward();
    f.layer->weight.mutable_grad()[0][1] = bad;  // an overflow in one element of one gradient
    const auto before = f.params();
    CHECK_FALSE(scaler.step(sgd));
    CHECK(same(f.params(), before));  // parameters unchanged
    CHECK(scaler.scale_value() == 32768.0);
    CHECK(scaler.scale_tensor().item<double>() == 32768.0);
    CHECK(scaler.skipped_steps() == 1);
    CHECK(scaler.growth_tracker() == 0);
    // The next clean step steps again at the lower scale.
    sgd.zero_grad();
    scaler.scale(f.loss()).backward();
    CHECK(scaler.step(sgd));
    CHECK_FALSE(same(f.params(), before));
    CHECK(scaler.scale_value() == 32768.0);
    CHECK(scaler.skipped_steps() == 1);
  }
}

TEST_CASE("GradScaler: the scale grows by growth_factor after growth_interval clean steps", "[precision][scaler]") {
  scaled_fixture f;
  p::GradScaler scaler(torch::kCPU, {.init_scale = 1024, .growth_interval = 3});
  torch::optim::SGD sgd(f.layer->parameters(), 0.01);
  auto clean_step = [&] {
    sgd.zero_grad();
    scaler.scale(f.loss()).backward();
    return scaler.step(sgd);
  };
  CHECK(clean_step());
  CHECK(clean_step());
  CHECK(scaler.scale_value() == 1024);
  CHECK(scaler.growth_tracker() == 2);
  CHECK(clean_step());
  CHECK(scaler.scale_value() == 2048);
  CHECK(scaler.growth_tracker() == 0);
  // An overflow resets the count of clean steps.
  CHECK(clean_step());
  sgd.zero_grad();
  scaler.scale(f.loss()).backward();
  f.layer->bias.mutable_grad()[0] = std::numeric_limits<float>::infinity();
  CHECK_FALSE(scaler.step(sgd));
  CHECK(scaler.scale_value() == 1024);
  CHECK(clean_step());
  CHECK(clean_step());
  CHECK(scaler.scale_value() == 1024);
  CHECK(clean_step());
  CHECK(scaler.scale_value() == 2048);
  CHECK(scaler.skipped_steps() == 1);
}

TEST_CASE("GradScaler: an overflow on another rank skips this rank's step too", "[precision][scaler]") {
  // `agree` is where the maximum over ranks is taken; here it plays a rank whose gradients overflowed.
  scaled_fixture f;
  int calls = 0;
  p::GradScaler scaler(torch::kCPU, {}, [&](torch::Tensor& found_inf) {
    ++calls;
    CHECK(found_inf.item<float>() == 0);  // this rank's gradients are finite
    found_inf.fill_(1.0);
  });
  torch::optim::SGD sgd(f.layer->parameters(), 0.1);
  scaler.scale(f.loss()).backward();
  const auto before = f.params();
  CHECK_FALSE(scaler.step(sgd));
  CHECK(calls == 1);
  CHECK(same(f.params(), before));
  CHECK(scaler.scale_value() == 32768.0);
  CHECK(scaler.skipped_steps() == 1);
}

TEST_CASE("precision::amp<bf16, dynamic_loss_scale> scales the loss, trains, and skips overflowed steps", "[precision][scaler]") {
  using amp = p::amp<p::bf16, p::dynamic_loss_scale>;
  STATIC_REQUIRE(amp::state::loss_scaling);
  STATIC_REQUIRE(dtrain::PrecisionPolicy<amp>);
  amp::state state(torch::kCPU);
  scaled_fixture f;
  torch::optim::SGD sgd(f.layer->parameters(), 0.05);
  double first = 0, last = 0;
  for (int i = 0; i < 20; ++i) {
    sgd.zero_grad();
    torch::Tensor loss;
    {
      auto scope = state.autocast();
      loss = torch::mse_loss(f.layer->forward(f.x).to(torch::kFloat), f.y);
    }
    state.backward(loss);
    if (i == 5) f.layer->weight.mutable_grad()[0][0] = std::numeric_limits<float>::infinity();
    CHECK(state.step(sgd) == (i != 5));
    (i == 0 ? first : last) = loss.item<double>();
  }
  CHECK(last < 0.9 * first);
  CHECK(state.skipped_steps() == 1);
  CHECK(state.loss_scale() == 32768.0);
  // The gradients the optimizer saw were unscaled: a scaled one would have diverged at once.
  CHECK(std::isfinite(last));
}

TEST_CASE("dense_gradients lends an optimizer the dense equal of a sparse gradient and gives it back", "[precision][sparse]") {
  // Two copies of a 6 x 3 table: one steps from sparse gradients lent as dense, the other from the
  // dense gradients themselves. Values are multiples of 1/4, so every sum is exact and the two
  // must agree bitwise.
  auto sparse_p = torch::arange(18, torch::kFloat).reshape({6, 3}).div(8).requires_grad_();
  auto dense_p = sparse_p.detach().clone().requires_grad_();
  torch::optim::Adam sparse_opt({sparse_p}, 0.1), dense_opt({dense_p}, 0.1);
  dtrain::precision::dense_gradients lender;
  const std::vector<std::vector<std::int64_t>> rows_of_step{{4, 1, 4}, {0, 5}, {2}};  // a repeat; then other rows
  for (const auto& rows : rows_of_step) {
    const auto n = static_cast<std::int64_t>(rows.size());
    const auto values = torch::arange(n * 3, torch::kFloat).reshape({n, 3}).sub(2).div(4);
    const auto g = torch::sparse_coo_tensor(torch::tensor(rows).unsqueeze(0), values, {6, 3});
    sparse_p.mutable_grad() = g;
    dense_p.mutable_grad() = g.to_dense();
    {
      const auto lent = lender.lend(sparse_opt);
      REQUIRE_FALSE(sparse_p.grad().is_sparse());
      // Rows of the previous step are cleared: only this step's rows hold values.
      CHECK(torch::equal(sparse_p.grad(), dense_p.grad()));
      sparse_opt.step();
    }
    CHECK(sparse_p.grad().is_same(g));
    dense_opt.step();
    CHECK(torch::equal(sparse_p, dense_p));
  }
  // A dense gradient is left alone.
  sparse_p.mutable_grad() = torch::ones({6, 3});
  const auto before = sparse_p.grad();
  {
    const auto lent = lender.lend(sparse_opt);
    CHECK(sparse_p.grad().is_same(before));
  }
}

TEST_CASE("ctx.step's CPU Adam and AdamW, stepped block by block, give opt.step()'s parameters and state bitwise", "[precision][adam]") {
  // 3 blocks and a ragged tail, and a small tensor; weight decay, amsgrad and AdamW's decoupled
  // decay each take their own branch.
  auto params = [] {
    torch::manual_seed(3);
    return std::vector<torch::Tensor>{torch::randn({3 * dtrain::precision::detail::adam_block + 123}),
                                      torch::randn({7, 5})};
  };
  auto run = [&](auto make, bool blocked) {
    auto ps = params();
    for (auto& p : ps) p.requires_grad_();
    auto opt = make(ps);
    for (int step = 0; step < 5; ++step) {
      for (auto& p : ps) p.mutable_grad() = torch::randn_like(p).mul_(0.1 * (step + 1));
      if (blocked) {
        using State = std::conditional_t<std::is_same_v<decltype(opt), torch::optim::Adam>,
                                         torch::optim::AdamParamState, torch::optim::AdamWParamState>;
        REQUIRE(dtrain::precision::detail::blockable<State>(opt));  // the blocked path, not opt.step()
        CHECK_FALSE(dtrain::precision::optimizer_step(opt));       // no fused kernel on the CPU
      } else {
        opt.step();
      }
    }
    // Parameters, then each one's state: step count, moments and amsgrad's maximum.
    using State = std::conditional_t<std::is_same_v<decltype(opt), torch::optim::Adam>,
                                     torch::optim::AdamParamState, torch::optim::AdamWParamState>;
    std::vector<torch::Tensor> out;
    for (auto& p : ps) out.push_back(p.detach());
    for (auto& p : ps) {
      const auto* state = dtrain::precision::detail::find_state<State>(opt, p);
      REQUIRE(state != nullptr);
      out.push_back(torch::tensor(state->step()));
      out.push_back(state->exp_avg());
      out.push_back(state->exp_avg_sq());
      if (state->max_exp_avg_sq().defined()) out.push_back(state->max_exp_avg_sq());
    }
    return std::make_pair(out, opt.state().size());
  };
  auto same = [&](auto make) {
    torch::manual_seed(11);
    const auto [plain, plain_states] = run(make, false);
    torch::manual_seed(11);
    const auto [blocked, blocked_states] = run(make, true);
    CHECK(plain_states == blocked_states);
    REQUIRE(plain.size() == blocked.size());
    for (std::size_t i = 0; i < plain.size(); ++i) CHECK(torch::equal(plain[i], blocked[i]));
  };
  same([](std::vector<torch::Tensor> ps) { return torch::optim::Adam(ps, torch::optim::AdamOptions(1e-2)); });
  same([](std::vector<torch::Tensor> ps) {
    return torch::optim::Adam(ps, torch::optim::AdamOptions(1e-2).weight_decay(0.01).amsgrad(true));
  });
  same([](std::vector<torch::Tensor> ps) { return torch::optim::AdamW(ps, torch::optim::AdamWOptions(1e-2)); });
  same([](std::vector<torch::Tensor> ps) {
    return torch::optim::AdamW(ps, torch::optim::AdamWOptions(1e-2).weight_decay(0.05).amsgrad(true));
  });
}
