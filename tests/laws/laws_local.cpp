// SPDX-License-Identifier: Apache-2.0
// Every Sampler, Precision and Checkpointer policy through its category's law checker.

#include "checkpointer.hpp"
#include "precision.hpp"
#include "sampler.hpp"
#include "../unit/support.hpp"

#include <dtrain/checkpointer/directory.hpp>
#include <dtrain/checkpointer/none.hpp>
#include <dtrain/sampler/distributed.hpp>
#include <dtrain/sampler/sequential.hpp>

namespace s = dtrain::sampler;
namespace p = dtrain::precision;
using dtrain_laws::sampler::cover;

// ---- Samplers -----------------------------------------------------------------------------------

TEST_CASE("sampler sequential: each epoch a disjoint cover, in contiguous blocks", "[laws][sampler]") {
  dtrain_laws::sampler::check<s::sequential>(cover::exact, /*shuffles=*/false);
  // Its own promise beyond the concept: rank r's block follows rank r-1's, in order.
  for (int world = 1; world <= 4; ++world) {
    std::vector<std::int64_t> all;
    for (int r = 0; r < world; ++r) {
      const auto mine = s::sequential::indices(97, r, world, 3);
      all.insert(all.end(), mine.begin(), mine.end());
    }
    std::vector<std::int64_t> in_order(97);
    std::iota(in_order.begin(), in_order.end(), 0);
    CHECK(all == in_order);
  }
}

TEST_CASE("sampler distributed default: pad, shuffled per epoch", "[laws][sampler]") {
  dtrain_laws::sampler::check<s::distributed<>>(cover::pad, /*shuffles=*/true);
}

TEST_CASE("sampler distributed seed 42 drop: disjoint, n mod world left out", "[laws][sampler]") {
  dtrain_laws::sampler::check<s::distributed<42, true, s::tail::drop>>(cover::drop, /*shuffles=*/true);
}

TEST_CASE("sampler distributed unshuffled pad: the identity order, wrapped", "[laws][sampler]") {
  using unshuffled = s::distributed<7, false, s::tail::pad>;
  dtrain_laws::sampler::check<unshuffled>(cover::pad, /*shuffles=*/false);
  const auto s = dtrain_laws::sampler::interleaved<unshuffled>(10, 4, 2);
  CHECK(s == std::vector<std::int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1});
}

TEST_CASE("sampler distributed: the seed chooses the permutation", "[laws][sampler]") {
  using dtrain_laws::sampler::interleaved;
  for (const std::int64_t epoch : {0, 1, 4})
    CHECK(interleaved<s::distributed<0>>(100, 2, epoch) != interleaved<s::distributed<1>>(100, 2, epoch));
}

// ---- Precisions ---------------------------------------------------------------------------------

TEST_CASE("precision fp32", "[laws][precision]") { dtrain_laws::precision::check<p::fp32>(); }

TEST_CASE("precision amp bf16", "[laws][precision]") { dtrain_laws::precision::check<p::amp<p::bf16>>(); }

TEST_CASE("precision amp bf16 with dynamic loss scaling", "[laws][precision]") {
  dtrain_laws::precision::check<p::amp<p::bf16, p::dynamic_loss_scale>>();
}

TEST_CASE("precision amp fp16 is not checked on CPU: its state refuses the CPU", "[laws][precision]") {
  // LibTorch before 2.4 cannot autocast CPU code to fp16, so amp<fp16> is a GPU policy here: the
  // Trainer rejects it with a CPU backend at compile time (tests/compile), and its state refuses
  // a CPU device. tests/gpu can run dtrain_laws::precision::check<amp<fp16>>(torch::kCUDA).
  if constexpr (dtrain::compat::cpu_autocasts_fp16) {
    dtrain_laws::precision::check<p::amp<p::fp16>>();
  } else {
    WARN("amp<fp16> skipped: LibTorch " TORCH_VERSION " has no fp16 autocast on CPU");
    CHECK_THROWS_MATCHES(p::amp<p::fp16>::state(torch::kCPU), dtrain::ConfigError,
                         dtrain_test::MessageContains({"amp<fp16> on CPU", "amp<bf16>"}));
  }
}

// ---- Checkpointers ------------------------------------------------------------------------------

TEST_CASE("checkpointer laws: directory<> (asynchronous and synchronous) and none", "[laws][checkpointer]") {
  dtrain_test::TempDir tmp;
  SECTION("directory<true>") { dtrain_laws::check_persisting_checkpointer<dtrain::checkpointer::directory<true>>(tmp / "async"); }
  SECTION("directory<false>") { dtrain_laws::check_persisting_checkpointer<dtrain::checkpointer::directory<false>>(tmp / "sync"); }
  SECTION("none") { dtrain_laws::check_non_persisting_checkpointer<dtrain::checkpointer::none>(tmp / "none"); }
}
