// SPDX-License-Identifier: Apache-2.0
#pragma once
// Fashion-MNIST from the gzipped IDX files of Debian's dataset-fashion-mnist.

#include <array>
#include <filesystem>
#include <future>
#include <string>
#include <string_view>

#include <torch/types.h>

#include <dtrain/data/dataset.hpp>
#include <dtrain/data/idx.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace data {

/// Zalando's Fashion-MNIST: 60,000 training and 10,000 test images, 28x28 grey, ten classes.
///
/// Pixels are normalised as the peer does, (x / 255 - 0.2860) / 0.3530, as float [N, 1, 28, 28];
/// labels are int64 [N]. Load it before fit(): the driver decodes it once and forked workers share
/// it copy-on-write; a missing or malformed file stops the run before any worker starts.
class FashionMnist {
 public:
  static constexpr const char* default_directory = "/usr/share/datasets/fashion-mnist";
  static constexpr float mean = 0.2860f, stddev = 0.3530f;
  static constexpr std::array<std::string_view, 10> class_names = {
      "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
      "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};

  /// Reads the four *-ubyte.gz files under `directory` (the two splits in parallel). Throws
  /// DataError naming the file and the problem: missing, not gzip, bad magic number, truncated
  /// payload, images and labels whose counts disagree, or a label outside 0-9.
  static FashionMnist load(const std::filesystem::path& directory = default_directory) {
    auto test = std::async(std::launch::async, [&] {
      return read(directory / "t10k-images-idx3-ubyte.gz", directory / "t10k-labels-idx1-ubyte.gz");
    });
    FashionMnist d;
    d.train_ = read(directory / "train-images-idx3-ubyte.gz", directory / "train-labels-idx1-ubyte.gz");
    d.test_ = test.get();
    return d;
  }

  const TensorDataset& train() const { return train_; }
  const TensorDataset& test() const { return test_; }

  /// Decodes one split from an images file and a labels file.
  static TensorDataset read(const std::filesystem::path& images, const std::filesystem::path& labels) {
    const torch::Tensor x = detail::read_idx_ubyte(images, 3);
    if (x.size(1) != 28 || x.size(2) != 28)
      throw DataError(images.string() + ": images are " + std::to_string(x.size(1)) + "x" +
                      std::to_string(x.size(2)) + ", Fashion-MNIST's are 28x28");
    const torch::Tensor y = detail::read_idx_ubyte(labels, 1);
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
    // One fused pass: (x / 255 - mean) / std == x * (1 / (255 std)) - mean / std.
    auto data = x.to(torch::kFloat32).mul_(1.0f / (255.0f * stddev)).sub_(mean / stddev).unsqueeze_(1);
    return {data, y.to(torch::kInt64)};
  }

 private:
  TensorDataset train_, test_;
};

static_assert(Splits<FashionMnist>);

}  // namespace data

DTRAIN_NAMESPACE_END
