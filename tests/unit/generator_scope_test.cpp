// SPDX-License-Identifier: Apache-2.0
// Generators of their own: detail::GeneratorScope, and a map_batches<C> stage whose constructor
// initialises a model and whose calls draw noise, beside LibTorch's default generator.

#include "../dtrain_catch.hpp"

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <dtrain/data/collate.hpp>
#include <dtrain/data/pipeline.hpp>
#include <dtrain/data/shard.hpp>
#include <dtrain/detail/generator_scope.hpp>

namespace {

namespace gd = dtrain::data;

torch::Tensor default_state() { return at::detail::getDefaultCPUGenerator().get_state(); }

std::vector<std::int64_t> first_n(std::int64_t n) {
  std::vector<std::int64_t> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = i;
  return v;
}

// A stage that builds a model (random initialisation) and adds noise in its calls.
struct RandomEncoder {
  static inline std::atomic<int> built{0};
  torch::nn::Linear net{nullptr};
  explicit RandomEncoder(int width) : net(1, width) { ++built; }
  gd::Fields operator()(gd::Fields b) {
    const auto x = b["v"].to(torch::kFloat32).unsqueeze(1);
    b.set("embedding", net(x) + torch::randn({x.size(0), net->options.out_features()}));
    return b;
  }
};

auto encoder_pipeline(std::uint64_t seed, int threads, int concurrency) {
  auto p = gd::map([](std::int64_t i) { return gd::Fields{{"v", torch::tensor(i)}}; }) | gd::collate(gd::stack()) |
           gd::map_batches<RandomEncoder>({.concurrency = concurrency}, 8);
  return gd::pipelined(first_n(64), std::move(p), {.loader_threads = threads, .seed = seed});
}

template <class Data>
std::vector<torch::Tensor> embeddings(const Data& ds) {
  std::vector<torch::Tensor> out;
  for (const auto& b : gd::batches(ds, first_n(64), 8, 0, {}, 1)) out.push_back(b["embedding"]);
  return out;
}

}  // namespace

TEST_CASE("GeneratorScope: random operators draw from the scope's generator and leave the default one alone", "[data][generator]") {
  torch::manual_seed(3);
  const auto before = default_state();
  torch::Tensor w1, r1, w2, inner;
  {
    dtrain::detail::GeneratorScope scope(42);
    w1 = torch::nn::Linear(4, 3)->weight.detach().clone();  // kaiming_uniform_ without a generator
    r1 = torch::randn({5}) + torch::dropout(torch::ones({5}), 0.5, true) + torch::randint(9, {5});
    {
      dtrain::detail::GeneratorScope nested(7);
      inner = torch::rand({3});
    }
  }
  CHECK(torch::equal(default_state(), before));
  // LibTorch's other random operators, and the composite ones that call them.
  const auto draws = [] {
    const auto p = torch::full({4}, 0.5);
    std::vector<torch::Tensor> t{torch::multinomial(p, 2), torch::randperm(6), at::normal(p, 1.0), torch::bernoulli(p),
                                 torch::poisson(p), torch::rand_like(p), torch::randint_like(p, 5), torch::randn({2}).exponential_(),
                                 std::get<1>(torch::native_dropout(p, 0.5, true)), torch::nn::init::orthogonal_(torch::empty({3, 3})),
                                 torch::nn::Dropout(0.5)->forward(torch::ones({6}))};
    return t;
  };
  std::vector<torch::Tensor> once, again;
  {
    dtrain::detail::GeneratorScope scope(5);
    once = draws();
  }
  {
    dtrain::detail::GeneratorScope scope(5);
    again = draws();
  }
  CHECK(torch::equal(default_state(), before));
  for (std::size_t k = 0; k < once.size(); ++k) CHECK(torch::equal(once[k].to(torch::kFloat64), again[k].to(torch::kFloat64)));
  std::thread other([&] {  // another thread, the same seed: the same draws
    dtrain::detail::GeneratorScope scope(42);
    w2 = torch::nn::Linear(4, 3)->weight.detach().clone();
  });
  other.join();
  CHECK(torch::equal(w1, w2));
  {
    dtrain::detail::GeneratorScope nested(7);
    CHECK(torch::equal(torch::rand({3}), inner));
  }
  CHECK_FALSE(torch::equal(torch::nn::Linear(4, 3)->weight, w1));  // outside a scope: the default generator
  CHECK_FALSE(torch::equal(default_state(), before));
}

TEST_CASE("stage: a map_batches<C> stage's constructor and calls draw from its own generators, seeded by the pipeline", "[data][generator][stage]") {
  RandomEncoder::built = 0;
  torch::manual_seed(5);
  const auto before = default_state();
  const auto alone = embeddings(encoder_pipeline(11, 0, 1));
  CHECK(torch::equal(default_state(), before));  // nothing the stage drew came from the default generator
  // Two instances built on loader threads while this thread draws from the default generator: the
  // same batches, and this thread's draws as they would be without them.
  const int built = RandomEncoder::built;
  torch::manual_seed(9);
  const auto expected = torch::rand({2000});
  torch::manual_seed(9);
  std::vector<torch::Tensor> threaded;
  torch::Tensor drawn;
  {
    const auto ds = encoder_pipeline(11, 4, 2);
    std::thread loop([&] { threaded = embeddings(ds); });
    std::vector<torch::Tensor> parts;
    for (int k = 0; k < 200; ++k) parts.push_back(torch::rand({10}));
    loop.join();
    drawn = torch::cat(parts);
  }
  CHECK(torch::equal(drawn, expected));
  CHECK(RandomEncoder::built > built);
  REQUIRE(threaded.size() == alone.size());
  for (std::size_t k = 0; k < alone.size(); ++k) CHECK(torch::equal(threaded[k], alone[k]));
  // Another pipeline seed: another model and other noise.
  CHECK_FALSE(torch::equal(embeddings(encoder_pipeline(12, 0, 1))[0], alone[0]));
}

TEST_CASE("pipeline: a transform that draws without taking the generator draws from the sample's generator", "[data][generator][pipeline]") {
  // map(f) and map_batches(g) with no at::Generator& argument, calling torch::rand all the same.
  auto p = gd::map([](std::int64_t i) { return gd::Fields{{"v", torch::tensor(i) + torch::rand({})}}; }) |
           gd::collate(gd::stack()) | gd::map_batches([](gd::Fields b) {
             b.set("noise", torch::rand({b.size()}));
             return b;
           });
  const auto on_loop = gd::pipelined(first_n(64), p, {.loader_threads = 0, .seed = 4});
  const auto on_threads = gd::pipelined(first_n(64), p, {.loader_threads = 3, .seed = 4});
  torch::manual_seed(2);
  const auto before = default_state();
  std::vector<gd::Fields> a, b;
  for (const auto& x : gd::batches(on_loop, first_n(64), 8, 0, {}, 2)) a.push_back(x);
  for (const auto& x : gd::batches(on_threads, first_n(64), 8, 0, {}, 2)) b.push_back(x);
  CHECK(torch::equal(default_state(), before));
  REQUIRE(a.size() == b.size());
  for (std::size_t k = 0; k < a.size(); ++k) {
    CHECK(torch::equal(a[k]["v"], b[k]["v"]));
    CHECK(torch::equal(a[k]["noise"], b[k]["noise"]));
  }
  // What a transform draws without the generator is what it draws with it.
  auto with_g = gd::map([](std::int64_t i, at::Generator& g) { return gd::Fields{{"v", torch::tensor(i) + torch::rand({}, g)}}; }) |
                gd::collate(gd::stack());
  const auto explicit_g = gd::pipelined(first_n(64), with_g, {.loader_threads = 0, .seed = 4});
  CHECK(torch::equal(explicit_g.get_batch(torch::arange(8), 2)["v"], a[0]["v"]));
}
