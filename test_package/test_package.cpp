// SPDX-License-Identifier: Apache-2.0
// A program that uses dtrain as a dependency: two ranks' shares of a TensorDataset under
// sampler::distributed<>, and the Trainer type a real program would fit. Prints one line that the
// package tests check. It is Conan's test_package and the one source every consumer test
// (tests/consumer) builds: `test_package [how dtrain was found]`.

#include <dtrain/dtrain.hpp>

#include <cstdint>
#include <cstdio>
#include <type_traits>
#include <vector>

#include <torch/nn/modules/linear.h>

int main(int argc, char** argv) {
  const char* how = argc > 1 ? argv[1] : "package";
  constexpr std::int64_t n = 10;
  constexpr int world = 2;
  // Sample i: three features 3i, 3i+1, 3i+2 and the target i.
  const dtrain::data::TensorDataset dataset(torch::arange(3 * n, torch::kFloat32).reshape({n, 3}),
                                            torch::arange(n));

  using trainer = dtrain::Trainer<torch::nn::Linear, dtrain::data::TensorDataset>;
  using sampler = trainer::policies::sampler;
  static_assert(std::is_same_v<sampler, dtrain::sampler::distributed<>>);
  const trainer t(dtrain::ScalingConfig{.num_workers = world});

  // Together the ranks' shares of epoch 0 cover every sample once (10 divides evenly).
  std::vector<int> seen(n, 0);
  std::int64_t per_rank = -1, features = -1;
  for (int rank = 0; rank < t.scaling_config().num_workers; ++rank) {
    const std::vector<std::int64_t> mine = sampler::indices(dataset.size(), rank, world, 0);
    const dtrain::data::Batch batch = dataset.get_batch(torch::tensor(mine, torch::kInt64));
    for (std::size_t k = 0; k < mine.size(); ++k) {
      if (batch.target[k].item<std::int64_t>() != mine[k] ||
          batch.data[k][0].item<float>() != 3.0f * mine[k]) {
        std::printf("rank %d: sample %lld of the batch is not sample %lld\n", rank, (long long)k,
                    (long long)mine[k]);
        return 1;
      }
      ++seen[mine[k]];
    }
    per_rank = batch.data.size(0);
    features = batch.data.size(1);
  }
  for (std::int64_t i = 0; i < n; ++i)
    if (seen[i] != 1) {
      std::printf("sample %lld seen %d times in epoch 0\n", (long long)i, seen[i]);
      return 1;
    }

  // DTRAIN_WITH_CUDA comes from the package (the target's compile definition), never guessed here;
  // so does DTRAIN_SEPARATE_COMPILATION, where the package is dtrain's compiled library.
#ifdef DTRAIN_SEPARATE_COMPILATION
  const char* mode = ", compiled library";
#else
  const char* mode = "";
#endif
  std::printf("dtrain %d.%d.%d (%s): %d ranks cover %lld samples, batches of [%lld, %lld], DTRAIN_WITH_CUDA=%d%s\n",
              DTRAIN_VERSION_MAJOR, DTRAIN_VERSION_MINOR, DTRAIN_VERSION_PATCH, how, world, (long long)n,
              (long long)per_rank, (long long)features, DTRAIN_WITH_CUDA, mode);
  return 0;
}
