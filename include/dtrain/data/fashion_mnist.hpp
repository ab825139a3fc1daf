// SPDX-License-Identifier: Apache-2.0
#pragma once
// Fashion-MNIST from the gzipped IDX files of Debian's dataset-fashion-mnist.

#include <array>
#include <filesystem>
#include <future>
#include <string>
#include <string_view>
#include <utility>

#include <torch/types.h>

#include <dtrain/data/dataset.hpp>
#include <dtrain/data/idx.hpp>
#include <dtrain/data/idx_cache.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace data {

/// A split of grey images kept as their bytes (uint8 [N, 1, H, W]) and normalised per batch:
/// get_batch gives float (x / 255 - mean) / stddev, computed as x * (1 / (255 stddev)) - mean /
/// stddev in float, the same operations on the same values as normalising the whole split once,
/// so the floats are bitwise the same. A quarter of the memory of float images, no pass over the
/// whole split before training, and forked workers share the bytes (copy-on-write, or the mapped
/// cache file).
class NormalizedImages {
 public:
  NormalizedImages() = default;
  NormalizedImages(torch::Tensor pixels, torch::Tensor targets, float mean, float stddev);

  std::int64_t size() const { return pixels_.defined() ? pixels_.size(0) : 0; }
  Batch get_batch(const torch::Tensor& indices) const {
    return {normalize(pixels_.index_select(0, indices)), targets_.index_select(0, indices)};
  }

  /// The whole split normalised, float [N, C, H, W]: computed on each call (N x C x H x W x 4 bytes).
  torch::Tensor data() const { return normalize(pixels_); }
  /// The bytes as read (read-only: they may be a mapped cache file, which must be replaced, never
  /// edited in place, while a process maps it; dtrain renames a new file into place).
  const torch::Tensor& pixels() const { return pixels_; }
  const torch::Tensor& targets() const { return targets_; }

 private:
  torch::Tensor normalize(const torch::Tensor& bytes) const {
    return bytes.to(torch::kFloat32).mul_(scale_).sub_(shift_);
  }

  torch::Tensor pixels_, targets_;
  float scale_ = 1, shift_ = 0;
};

static_assert(RandomAccess<NormalizedImages>);

/// Zalando's Fashion-MNIST: 60,000 training and 10,000 test images, 28x28 grey, ten classes.
///
/// Batches are normalised as the peer does, (x / 255 - 0.2860) / 0.3530, as float [B, 1, 28, 28]
/// (NormalizedImages: the split stays uint8); labels are int64 [N]. Load it before fit(): the
/// driver reads it once and forked workers share it; a missing or malformed file stops the run
/// before any worker starts. The decompressed files are cached (data::default_cache_directory())
/// and mapped on later runs.
class FashionMnist {
 public:
  static constexpr const char* default_directory = "/usr/share/datasets/fashion-mnist";
  static constexpr float mean = 0.2860f, stddev = 0.3530f;
  static constexpr std::array<std::string_view, 10> class_names = {
      "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
      "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};

  /// Reads the four *-ubyte.gz files under `directory` (the two splits in parallel) through the
  /// cache under `cache_dir` (empty: no cache). Throws DataError naming the file and the problem:
  /// missing, not gzip, bad magic number, truncated payload, images and labels whose counts
  /// disagree, or a label outside 0-9.
  static FashionMnist load(const std::filesystem::path& directory = default_directory,
                           const std::filesystem::path& cache_dir = default_cache_directory());

  const NormalizedImages& train() const { return train_; }
  const NormalizedImages& test() const { return test_; }

  /// Decodes one split from an images file and a labels file (through the cache under
  /// `cache_dir` when it is not empty).
  static NormalizedImages read(const std::filesystem::path& images, const std::filesystem::path& labels,
                               const std::filesystem::path& cache_dir = {});

 private:
  NormalizedImages train_, test_;
};

static_assert(Splits<FashionMnist>);

}  // namespace data

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/data/impl/fashion_mnist.ipp>
#endif
