// SPDX-License-Identifier: Apache-2.0
#include "support.hpp"

#include <dtrain/evaluation/classification.hpp>

#include <torch/torch.h>

using dtrain::evaluation::ConfusionMatrix;

TEST_CASE("ConfusionMatrix: a hand-computed case", "[evaluation]") {
  // truth:      0 0 0 1 1 2
  // prediction: 0 0 1 1 2 2
  ConfusionMatrix cm(3);
  cm.update(torch::tensor({0, 0, 1, 1, 2, 2}), torch::tensor({0, 0, 0, 1, 1, 2}));
  CHECK(cm.total() == 6);
  CHECK(cm.counts()[0][0].item<double>() == 2);
  CHECK(cm.counts()[0][1].item<double>() == 1);
  CHECK(cm.counts()[1][2].item<double>() == 1);
  CHECK(cm.accuracy() == Approx(4.0 / 6));
  const auto pc = cm.per_class();
  // class 0: tp 2, predicted 2, actual 3; class 1: tp 1, predicted 2, actual 2; class 2: tp 1, predicted 2, actual 1
  CHECK(pc.precision[0] == Approx(1.0));
  CHECK(pc.recall[0] == Approx(2.0 / 3));
  CHECK(pc.precision[1] == Approx(0.5));
  CHECK(pc.recall[1] == Approx(0.5));
  CHECK(pc.precision[2] == Approx(0.5));
  CHECK(pc.recall[2] == Approx(1.0));
  const double f0 = 2 * 1.0 * (2.0 / 3) / (1.0 + 2.0 / 3), f1 = 0.5, f2 = 2 * 0.5 * 1.0 / 1.5;
  const auto s = cm.summary("test_");
  CHECK(s.at("test_f1_macro").number() == Approx((f0 + f1 + f2) / 3));
  CHECK(s.at("test_f1_weighted").number() == Approx((3 * f0 + 2 * f1 + 1 * f2) / 6));
  CHECK(s.at("test_precision_macro").number() == Approx((1.0 + 0.5 + 0.5) / 3));
  CHECK(s.at("test_recall_weighted").number() == Approx(4.0 / 6));  // weighted recall is accuracy
  CHECK(s.at("test_accuracy").number() == Approx(4.0 / 6));
}

TEST_CASE("ConfusionMatrix: scores are argmaxed - a class never predicted has precision 0", "[evaluation]") {
  ConfusionMatrix cm(3);
  cm.update(torch::tensor({{0.9, 0.1, 0.0}, {0.2, 0.7, 0.1}}), torch::tensor({0, 2}));
  const auto pc = cm.per_class();
  CHECK(pc.precision[2] == 0.0);
  CHECK(pc.recall[2] == 0.0);
  CHECK(pc.f1[2] == 0.0);
  CHECK(cm.accuracy() == 0.5);
}

TEST_CASE("ConfusionMatrix: any split of the batches, merged, gives the whole's numbers exactly", "[evaluation]") {
  torch::manual_seed(3);
  const auto scores = torch::randn({1000, 10});
  const auto targets = torch::randint(0, 10, {1000});
  ConfusionMatrix whole(10);
  whole.update(scores, targets);
  // Two "ranks" with uneven contiguous blocks (sampler::sequential's split), in batches of 64.
  ConfusionMatrix rank0(10), rank1(10);
  for (std::int64_t at = 0; at < 501; at += 64) {
    const auto n = std::min<std::int64_t>(64, 501 - at);
    rank0.update(scores.narrow(0, at, n), targets.narrow(0, at, n));
  }
  for (std::int64_t at = 501; at < 1000; at += 64) {
    const auto n = std::min<std::int64_t>(64, 1000 - at);
    rank1.update(scores.narrow(0, at, n), targets.narrow(0, at, n));
  }
  rank0.merge(rank1);
  CHECK(torch::equal(rank0.counts(), whole.counts()));
  CHECK(rank0.summary() == whole.summary());
}

TEST_CASE("ConfusionMatrix: bad inputs are clear errors", "[evaluation]") {
  ConfusionMatrix cm(3);
  CHECK_THROWS_WITH(cm.update(torch::tensor({0, 1}), torch::tensor({0})), Catch::Contains("one prediction per target"));
  CHECK_THROWS_WITH(cm.update(torch::tensor({0, 3}), torch::tensor({0, 1})), Catch::Contains("outside [0, 3)"));
  CHECK_THROWS_WITH(ConfusionMatrix(1), Catch::Contains("at least 2 classes"));
  CHECK_THROWS_WITH(cm.merge(ConfusionMatrix(4)), Catch::Contains("4 classes into 3"));
}
