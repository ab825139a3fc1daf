// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of fashion_mnist.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/data/fashion_mnist.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace data {

DTRAIN_INLINE NormalizedImages::NormalizedImages(torch::Tensor pixels, torch::Tensor targets, float mean, float stddev)
    : pixels_(std::move(pixels)), targets_(std::move(targets)),
      scale_(1.0f / (255.0f * stddev)), shift_(mean / stddev) {
  if (pixels_.scalar_type() != torch::kUInt8 || pixels_.dim() != 4 || targets_.dim() != 1 ||
      pixels_.size(0) != targets_.size(0))
    throw DataError("NormalizedImages: needs uint8 pixels [N, C, H, W] and targets [N], got " +
                    std::to_string(pixels_.dim()) + "-d " + std::string(c10::toString(pixels_.scalar_type())) +
                    " pixels and " + std::to_string(targets_.dim()) + "-d targets" +
                    (pixels_.dim() >= 1 && targets_.dim() >= 1
                         ? " (" + std::to_string(pixels_.size(0)) + " and " + std::to_string(targets_.size(0)) + " samples)"
                         : std::string()));
}

DTRAIN_INLINE FashionMnist FashionMnist::load(const std::filesystem::path& directory,
                                              const std::filesystem::path& cache_dir) {
  auto test = std::async(std::launch::async, [&] {
    return read(directory / "t10k-images-idx3-ubyte.gz", directory / "t10k-labels-idx1-ubyte.gz", cache_dir);
  });
  FashionMnist d;
  d.train_ = read(directory / "train-images-idx3-ubyte.gz", directory / "train-labels-idx1-ubyte.gz", cache_dir);
  d.test_ = test.get();
  return d;
}

DTRAIN_INLINE NormalizedImages FashionMnist::read(const std::filesystem::path& images, const std::filesystem::path& labels,
                                                  const std::filesystem::path& cache_dir) {
  const torch::Tensor x = detail::read_idx_ubyte_cached(images, 3, cache_dir);
  if (x.size(1) != 28 || x.size(2) != 28)
    throw DataError(images.string() + ": images are " + std::to_string(x.size(1)) + "x" +
                    std::to_string(x.size(2)) + ", Fashion-MNIST's are 28x28");
  const torch::Tensor y = detail::read_idx_ubyte_cached(labels, 1, cache_dir);
  if (x.size(0) != y.size(0))
    throw DataError(images.string() + " holds " + std::to_string(x.size(0)) + " images but " +
                    labels.string() + " holds " + std::to_string(y.size(0)) +
                    " labels; the two files must come from the same split");
  // A label outside the 10 classes would fail an epoch later, inside the loss.
  if (y.numel() > 0)
    if (const auto top = y.max().item<std::int64_t>(); top > 9)
      throw DataError(labels.string() + ": holds label " + std::to_string(top) + " at sample " +
                      std::to_string(y.argmax().item<std::int64_t>()) +
                      "; Fashion-MNIST's labels are 0-9 (is it the right file, undamaged?)");
  return {x.unsqueeze(1), y.to(torch::kInt64), mean, stddev};
}
}  // namespace data
DTRAIN_NAMESPACE_END
