// SPDX-License-Identifier: Apache-2.0
// data/: IDX decoding, FashionMnist, TensorDataset, and data::batches.
//
// Every dataset here is written by the test itself, with zlib, into a scratch directory, so each bad
// input is exactly the one the test names.

#include <zlib.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <range/v3/iterator/operations.hpp>
#include <range/v3/range/concepts.hpp>
#include <range/v3/range/primitives.hpp>
#include <range/v3/view/iota.hpp>
#include <range/v3/view/take.hpp>
#include <range/v3/view/transform.hpp>
#include <torch/torch.h>

#include <dtrain/data/dataset.hpp>
#include <dtrain/data/fashion_mnist.hpp>
#include <dtrain/data/idx.hpp>
#include <dtrain/data/prefetch.hpp>
#include <dtrain/data/shard.hpp>
#include <dtrain/error.hpp>

#include "support.hpp"

namespace fs = std::filesystem;
using dtrain_test::MessageContains;
using dtrain_test::TempDir;
using Bytes = std::vector<std::uint8_t>;

namespace {

constexpr int kSide = 28;
constexpr int kPixels = kSide * kSide;

void put_be32(Bytes& out, std::uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<std::uint8_t>(v >> shift));
}

/// An IDX file: magic 0x0000 <type> <dims.size()>, the dimensions big-endian, then the payload.
Bytes idx(const std::vector<std::uint32_t>& dims, const Bytes& payload, std::uint8_t type = 0x08) {
  Bytes out = {0, 0, type, static_cast<std::uint8_t>(dims.size())};
  for (auto d : dims) put_be32(out, d);
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

/// `n` images whose pixels run through every byte value: pixel p of image i is (i * 784 + p) % 256.
Bytes image_pixels(int n) {
  Bytes px(static_cast<std::size_t>(n) * kPixels);
  for (std::size_t k = 0; k < px.size(); ++k) px[k] = static_cast<std::uint8_t>(k % 256);
  return px;
}

Bytes images_idx(int n) { return idx({std::uint32_t(n), kSide, kSide}, image_pixels(n)); }
Bytes labels_idx(const Bytes& labels) { return idx({std::uint32_t(labels.size())}, labels); }

void write_gz(const fs::path& path, const Bytes& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  REQUIRE(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())) == static_cast<int>(bytes.size()));
  REQUIRE(gzclose(f) == Z_OK);
}

void write_plain(const fs::path& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

Bytes read_plain(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

/// A directory laid out as Debian's dataset-fashion-mnist: `n_train` and `n_test` samples.
void write_fashion_mnist_dir(const fs::path& dir, int n_train, int n_test) {
  Bytes train_labels, test_labels;
  for (int i = 0; i < n_train; ++i) train_labels.push_back(static_cast<std::uint8_t>(i % 10));
  for (int i = 0; i < n_test; ++i) test_labels.push_back(static_cast<std::uint8_t>(9 - i % 10));
  write_gz(dir / "train-images-idx3-ubyte.gz", images_idx(n_train));
  write_gz(dir / "train-labels-idx1-ubyte.gz", labels_idx(train_labels));
  write_gz(dir / "t10k-images-idx3-ubyte.gz", images_idx(n_test));
  write_gz(dir / "t10k-labels-idx1-ubyte.gz", labels_idx(test_labels));
}

/// The floats the model was fed before issue 15: the whole split normalised once, in float.
torch::Tensor normalised_whole(const torch::Tensor& bytes) {
  using F = dtrain::data::FashionMnist;
  return bytes.to(torch::kFloat32).mul_(1.0f / (255.0f * F::stddev)).sub_(F::mean / F::stddev);
}

/// A dataset whose sample i has data [i, 10 i] and target i, so a batch shows which samples it holds.
dtrain::data::TensorDataset numbered(std::int64_t n) {
  auto ids = torch::arange(n, torch::kInt64);
  auto data = torch::stack({ids.to(torch::kFloat32), ids.to(torch::kFloat32) * 10}, 1);
  return {data, ids};
}

std::vector<std::int64_t> to_vector(const torch::Tensor& t) {
  auto c = t.contiguous().to(torch::kInt64);
  return {c.data_ptr<std::int64_t>(), c.data_ptr<std::int64_t>() + c.numel()};
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// FashionMnist::read on good files

TEST_CASE("FashionMnist::read decodes a tiny split: float N x 1 x 28 x 28 normalised, int64 labels",
          "[data]") {
  TempDir dir;
  const auto images = dir / "images.gz", labels = dir / "labels.gz";
  write_gz(images, images_idx(3));
  write_gz(labels, labels_idx({9, 0, 3}));

  const auto split = dtrain::data::FashionMnist::read(images, labels);

  REQUIRE(split.size() == 3);
  const auto& x = split.data();
  REQUIRE(x.scalar_type() == torch::kFloat32);
  REQUIRE(x.sizes() == torch::IntArrayRef{3, 1, kSide, kSide});
  REQUIRE(split.targets().scalar_type() == torch::kInt64);
  CHECK(to_vector(split.targets()) == std::vector<std::int64_t>{9, 0, 3});

  // Every pixel, against the formula in double: ((x / 255) - 0.2860) / 0.3530.
  const Bytes raw = image_pixels(3);
  auto flat = x.contiguous().view(-1);
  const float* got = flat.data_ptr<float>();
  double worst = 0;
  for (std::size_t k = 0; k < raw.size(); ++k) {
    const double want = (raw[k] / 255.0 - 0.2860) / 0.3530;
    worst = std::max(worst, std::abs(static_cast<double>(got[k]) - want));
  }
  CHECK(worst < 1e-6);

  // And a few by position: image 0 starts 0, 1, 2, ...; pixel 255 of image 0 is 255.
  CHECK(x[0][0][0][0].item<double>() == Approx(-0.2860 / 0.3530).margin(1e-6));
  CHECK(x[0][0][0][1].item<double>() == Approx((1 / 255.0 - 0.2860) / 0.3530).margin(1e-6));
  CHECK(x[0][0][255 / kSide][255 % kSide].item<double>() == Approx((1.0 - 0.2860) / 0.3530).margin(1e-6));
  // Image 1 starts at byte 784 % 256 = 16.
  CHECK(x[1][0][0][0].item<double>() == Approx((16 / 255.0 - 0.2860) / 0.3530).margin(1e-6));
}

TEST_CASE("FashionMnist::load reads the four files of a directory, train and test apart", "[data]") {
  TempDir dir;
  write_fashion_mnist_dir(dir.path(), 5, 2);

  const auto d = dtrain::data::FashionMnist::load(dir.path(), dir / "cache");

  CHECK(d.train().size() == 5);
  CHECK(d.test().size() == 2);
  CHECK(to_vector(d.train().targets()) == std::vector<std::int64_t>{0, 1, 2, 3, 4});
  CHECK(to_vector(d.test().targets()) == std::vector<std::int64_t>{9, 8});
  CHECK(d.test().data().sizes() == torch::IntArrayRef{2, 1, kSide, kSide});
}

// ---------------------------------------------------------------------------------------------------
// Bad inputs: each throws DataError whose message names the file and the problem.

TEST_CASE("A missing images file is a DataError naming the path", "[data][error]") {
  TempDir dir;
  const auto labels = dir / "labels.gz";
  write_gz(labels, labels_idx({1}));
  const auto missing = dir / "no-such-images.gz";

  REQUIRE_THROWS_MATCHES(dtrain::data::FashionMnist::read(missing, labels), dtrain::DataError,
                         MessageContains({missing.string(), "file not found"}));
}

// issue 18: labels outside 0-9 loaded silently and failed an epoch later, inside the loss.
TEST_CASE("fashion_mnist_label_out_of_range: a label above 9 is a DataError at load naming the file", "[data][error]") {
  TempDir dir;
  const auto images = dir / "images.gz", labels = dir / "labels.gz";
  write_gz(images, images_idx(3));
  write_gz(labels, labels_idx({9, 200, 3}));
  REQUIRE_THROWS_MATCHES(dtrain::data::FashionMnist::read(images, labels), dtrain::DataError,
                         MessageContains({labels.string() + ": holds label 200 at sample 1", "labels are 0-9"}));
}

// issue 18: a directory where a data file should be was reported as "file not found".
TEST_CASE("fashion_mnist_directory_in_place_of_file: a directory where a data file should be is named as such", "[data][error]") {
  TempDir dir;
  const auto images = dir / "images.gz", labels = dir / "labels.gz";
  write_gz(labels, labels_idx({1}));
  fs::create_directories(images);
  REQUIRE_THROWS_WITH(dtrain::data::FashionMnist::read(images, labels),
                      Catch::Contains(images.string() + ": is a directory where the data file should be"));
}

TEST_CASE("A missing labels file is a DataError naming the labels path", "[data][error]") {
  TempDir dir;
  const auto images = dir / "images.gz";
  write_gz(images, images_idx(1));
  const auto missing = dir / "no-such-labels.gz";

  REQUIRE_THROWS_MATCHES(dtrain::data::FashionMnist::read(images, missing), dtrain::DataError,
                         MessageContains({missing.string(), "file not found"}));
}

TEST_CASE("A bad magic number is a DataError naming the path and the magic found", "[data][error]") {
  TempDir dir;
  const auto images = dir / "images.gz", labels = dir / "labels.gz";
  write_gz(labels, labels_idx({1}));

  SECTION("the type code is not unsigned byte (0x0d, float)") {
    write_gz(images, idx({1, kSide, kSide}, Bytes(kPixels * 4), 0x0d));
    REQUIRE_THROWS_MATCHES(dtrain::data::FashionMnist::read(images, labels), dtrain::DataError,
                           MessageContains({images.string(), "bad magic number", "0x00000d03"}));
  }
  SECTION("images and labels swapped: the labels file has one dimension, not three") {
    write_gz(images, images_idx(1));
    REQUIRE_THROWS_MATCHES(dtrain::data::FashionMnist::read(labels, images), dtrain::DataError,
                           MessageContains({labels.string(), "bad magic number", "0x00000801",
                                            "expected 0x00000803"}));
  }
}

TEST_CASE("A payload shorter than its header promises is a DataError naming the path", "[data][error]") {
  TempDir dir;
  const auto images = dir / "images.gz", labels = dir / "labels.gz";
  // The header says 3 images; only 2 images' bytes follow.
  write_gz(images, idx({3, kSide, kSide}, image_pixels(2)));
  write_gz(labels, labels_idx({1, 2, 3}));

  REQUIRE_THROWS_MATCHES(
      dtrain::data::FashionMnist::read(images, labels), dtrain::DataError,
      MessageContains({images.string(), "truncated payload", std::to_string(3 * kPixels),
                       std::to_string(2 * kPixels)}));
}

TEST_CASE("A file too short for its IDX header is a DataError naming the path", "[data][error]") {
  TempDir dir;
  const auto images = dir / "images.gz", labels = dir / "labels.gz";
  write_gz(labels, labels_idx({1}));

  SECTION("shorter than the magic number") {
    write_gz(images, Bytes{0, 0});
    REQUIRE_THROWS_MATCHES(dtrain::data::FashionMnist::read(images, labels), dtrain::DataError,
                           MessageContains({images.string(), "too short for an IDX header"}));
  }
  SECTION("the magic number promises three dimensions; one follows") {
    Bytes header = {0, 0, 0x08, 3};
    put_be32(header, 1);
    write_gz(images, header);
    REQUIRE_THROWS_MATCHES(dtrain::data::FashionMnist::read(images, labels), dtrain::DataError,
                           MessageContains({images.string(), "truncated IDX header"}));
  }
}

TEST_CASE("Images and labels whose counts disagree are a DataError naming both files", "[data][error]") {
  TempDir dir;
  const auto images = dir / "images.gz", labels = dir / "labels.gz";
  write_gz(images, images_idx(3));
  write_gz(labels, labels_idx({1, 2}));

  REQUIRE_THROWS_MATCHES(dtrain::data::FashionMnist::read(images, labels), dtrain::DataError,
                         MessageContains({images.string(), labels.string(), "3 images", "2 labels"}));
}

TEST_CASE("A file that is not gzip is a DataError naming the path", "[data][error]") {
  // zlib would read a file without the gzip signature as it is; dtrain rejects it up front.
  TempDir dir;
  const auto images = dir / "images.gz", labels = dir / "labels.gz";
  write_gz(labels, labels_idx({1}));
  const std::string text = "this is a text file, not gzip and not IDX";
  write_plain(images, Bytes(text.begin(), text.end()));

  REQUIRE_THROWS_MATCHES(dtrain::data::FashionMnist::read(images, labels), dtrain::DataError,
                         MessageContains({images.string(), "not gzip-compressed"}));
}

TEST_CASE("Bytes after the payload the header promises are a DataError naming the path", "[data][error]") {
  TempDir dir;
  const auto images = dir / "images.gz", labels = dir / "labels.gz";
  write_gz(labels, labels_idx({1, 2}));
  Bytes long_file = images_idx(2);
  long_file.insert(long_file.end(), 5, 0x7f);
  write_gz(images, long_file);
  REQUIRE_THROWS_MATCHES(dtrain::data::FashionMnist::read(images, labels), dtrain::DataError,
                         MessageContains({images.string(), "5 trailing bytes"}));
}

TEST_CASE("Images that are not 28x28 are a DataError naming the path", "[data][error]") {
  TempDir dir;
  const auto images = dir / "images.gz", labels = dir / "labels.gz";
  write_gz(labels, labels_idx({1, 2}));
  write_gz(images, idx({2u, 14u, 14u}, Bytes(2 * 14 * 14, 3)));
  REQUIRE_THROWS_MATCHES(dtrain::data::FashionMnist::read(images, labels), dtrain::DataError,
                         MessageContains({images.string(), "14x14"}));
}

TEST_CASE("A gzip stream cut short is a DataError naming the path", "[data][error]") {
  TempDir dir;
  const auto images = dir / "images.gz", labels = dir / "labels.gz";
  write_gz(labels, labels_idx({1, 2, 3}));
  write_gz(images, images_idx(3));
  const auto full = fs::file_size(images);
  REQUIRE(full > 40);

  SECTION("cut in the middle of the compressed data") { fs::resize_file(images, full / 2); }
  SECTION("only the 8-byte trailer (CRC and length) missing") { fs::resize_file(images, full - 8); }

  REQUIRE_THROWS_MATCHES(dtrain::data::FashionMnist::read(images, labels), dtrain::DataError,
                         MessageContains({images.string(), "truncated or corrupt gzip stream"}));
}

TEST_CASE("Bytes after the end of the gzip stream are a DataError naming the path", "[data][error]") {
  // zlib's gzread ignored them: a file with garbage appended loaded as if whole.
  TempDir dir;
  const auto images = dir / "images.gz", labels = dir / "labels.gz";
  write_gz(labels, labels_idx({1, 2, 3}));
  write_gz(images, images_idx(3));
  Bytes gz = read_plain(images);
  const std::string garbage = "trailing garbage";
  gz.insert(gz.end(), garbage.begin(), garbage.end());
  write_plain(images, gz);
  REQUIRE_THROWS_MATCHES(dtrain::data::FashionMnist::read(images, labels), dtrain::DataError,
                         MessageContains({images.string(), "16 bytes follow the end of its gzip stream"}));
}

TEST_CASE("A corrupt gzip stream is a DataError naming the path", "[data][error]") {
  TempDir dir;
  const auto images = dir / "images.gz", labels = dir / "labels.gz";
  write_gz(labels, labels_idx({1, 2, 3}));
  write_gz(images, images_idx(3));
  Bytes gz = read_plain(images);
  REQUIRE(gz.size() > 20);

  SECTION("the first deflate block has the reserved block type") {
    gz[10] = 0x07;  // after the 10-byte gzip header: BFINAL = 1, BTYPE = 11 (reserved)
  }
  SECTION("the header names an unknown compression method") {
    gz[2] = 0x07;  // CM must be 8 (deflate)
  }
  SECTION("the CRC in the trailer does not match the data") {
    gz[gz.size() - 8] ^= 0xff;
  }
  write_plain(images, gz);

  REQUIRE_THROWS_MATCHES(dtrain::data::FashionMnist::read(images, labels), dtrain::DataError,
                         MessageContains({images.string(), "corrupt gzip stream"}));
}

TEST_CASE("FashionMnist::load on an empty directory is a DataError naming the missing file",
          "[data][error]") {
  TempDir dir;
  REQUIRE_THROWS_MATCHES(dtrain::data::FashionMnist::load(dir.path(), dir / "cache"), dtrain::DataError,
                         MessageContains({dir.path().string(), "-ubyte.gz", "file not found"}));
}

TEST_CASE("FashionMnist::load names the one file that is missing", "[data][error]") {
  TempDir dir;
  write_fashion_mnist_dir(dir.path(), 2, 2);

  SECTION("train labels") {
    fs::remove(dir / "train-labels-idx1-ubyte.gz");
    REQUIRE_THROWS_MATCHES(dtrain::data::FashionMnist::load(dir.path(), dir / "cache"), dtrain::DataError,
                           MessageContains({(dir / "train-labels-idx1-ubyte.gz").string(), "file not found"}));
  }
  SECTION("test images") {
    fs::remove(dir / "t10k-images-idx3-ubyte.gz");
    REQUIRE_THROWS_MATCHES(dtrain::data::FashionMnist::load(dir.path(), dir / "cache"), dtrain::DataError,
                           MessageContains({(dir / "t10k-images-idx3-ubyte.gz").string(), "file not found"}));
  }
}

TEST_CASE("FashionMnist::load reads Debian's dataset-fashion-mnist: 60000 train, 10000 test",
          "[data][dataset]") {
  const fs::path dir = dtrain::data::FashionMnist::default_directory;
  if (!fs::is_directory(dir)) {
    WARN("skipped: " << dir << " is absent (apt-get install dataset-fashion-mnist)");
    return;
  }
  const auto d = dtrain::data::FashionMnist::load();

  REQUIRE(d.train().size() == 60000);
  REQUIRE(d.test().size() == 10000);
  CHECK(d.train().data().sizes() == torch::IntArrayRef{60000, 1, kSide, kSide});
  CHECK(d.test().data().sizes() == torch::IntArrayRef{10000, 1, kSide, kSide});
  for (const auto* split : {&d.train(), &d.test()}) {
    CHECK(split->targets().min().item<std::int64_t>() == 0);
    CHECK(split->targets().max().item<std::int64_t>() == 9);
    // Fashion-MNIST is balanced: every class has a tenth of each split.
    const auto per_class = torch::bincount(split->targets());
    CHECK(per_class.numel() == 10);
    CHECK((per_class == split->size() / 10).all().item<bool>());
    // Normalised pixels span exactly (0 - mean) / std .. (1 - mean) / std.
    CHECK(split->data().min().item<double>() == Approx(-0.2860 / 0.3530).margin(1e-6));
    CHECK(split->data().max().item<double>() == Approx((1 - 0.2860) / 0.3530).margin(1e-6));
    // Every batch is bitwise what normalising the whole split at once gave (issue 15).
    const auto indices = torch::randperm(split->size(), torch::kInt64).narrow(0, 0, 4096);
    CHECK(torch::equal(split->get_batch(indices).data, normalised_whole(split->pixels()).index_select(0, indices)));
  }
}

// ---------------------------------------------------------------------------------------------------
// NormalizedImages and the decompressed cache

TEST_CASE("NormalizedImages batches are bitwise the floats of the split normalised at once", "[data]") {
  TempDir dir;
  write_fashion_mnist_dir(dir.path(), 7, 2);
  const auto d = dtrain::data::FashionMnist::load(dir.path(), dir / "cache");
  REQUIRE(d.train().pixels().scalar_type() == torch::kUInt8);
  REQUIRE(d.train().pixels().sizes() == torch::IntArrayRef{7, 1, kSide, kSide});
  const auto indices = torch::tensor(std::vector<std::int64_t>{6, 0, 3, 3});
  const auto batch = d.train().get_batch(indices);
  CHECK(batch.data.scalar_type() == torch::kFloat32);
  CHECK(torch::equal(batch.data, normalised_whole(d.train().pixels()).index_select(0, indices)));
  CHECK(to_vector(batch.target) == std::vector<std::int64_t>{6, 0, 3, 3});
  CHECK(torch::equal(d.test().data(), normalised_whole(d.test().pixels())));
}

TEST_CASE("NormalizedImages rejects pixels that are not uint8 N x C x H x W", "[data][error]") {
  using dtrain::data::NormalizedImages;
  REQUIRE_THROWS_MATCHES(NormalizedImages(torch::zeros({2, 1, 4, 4}), torch::zeros({2}), 0, 1), dtrain::DataError,
                         MessageContains({"uint8", "Float"}));
  REQUIRE_THROWS_MATCHES(NormalizedImages(torch::zeros({3, 1, 4, 4}, torch::kUInt8), torch::zeros({2}), 0, 1),
                         dtrain::DataError, MessageContains({"3 and 2 samples"}));
}

TEST_CASE("The decompressed cache is written once then mapped and rebuilt when damaged or stale", "[data]") {
  TempDir dir;
  write_fashion_mnist_dir(dir.path(), 5, 2);
  const auto cache = dir / "cache";
  const auto first = dtrain::data::FashionMnist::load(dir.path(), cache);
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(cache)) files.push_back(e.path());
  REQUIRE(files.size() == 4);  // the four files, decompressed, and no temporary left behind
  const auto train_cache = dtrain::data::detail::idx_cache_name(dir / "train-images-idx3-ubyte.gz");
  REQUIRE(fs::file_size(cache / train_cache) == images_idx(5).size());

  SECTION("a later load maps the cache: the same bytes") {
    const auto again = dtrain::data::FashionMnist::load(dir.path(), cache);
    CHECK(torch::equal(again.train().pixels(), first.train().pixels()));
    CHECK(to_vector(again.test().targets()) == std::vector<std::int64_t>{9, 8});
  }
  SECTION("a truncated cache file is rebuilt from the source") {
    // A new file in its place: `first` maps the old one, which must not change under it.
    auto bytes = read_plain(cache / train_cache);
    bytes.resize(bytes.size() - 100);
    fs::remove(cache / train_cache);
    write_plain(cache / train_cache, bytes);
    const auto again = dtrain::data::FashionMnist::load(dir.path(), cache);
    CHECK(torch::equal(again.train().pixels(), first.train().pixels()));
    CHECK(fs::file_size(cache / train_cache) == images_idx(5).size());
  }
  SECTION("a changed source gets a new cache file, not the old bytes") {
    write_fashion_mnist_dir(dir.path(), 3, 2);
    fs::last_write_time(dir / "train-images-idx3-ubyte.gz", fs::file_time_type::clock::now() + std::chrono::seconds(5));
    const auto again = dtrain::data::FashionMnist::load(dir.path(), cache);
    CHECK(again.train().size() == 3);
    CHECK(first.train().size() == 5);  // the run that mapped the old file keeps it
    // The old version's file is gone, the new one in its place: still four files.
    std::size_t now = 0;
    for (const auto& e : fs::directory_iterator(cache)) now += e.path().extension() == ".idx";
    CHECK(now == 4);
    CHECK(!fs::exists(cache / train_cache));
  }
  SECTION("an unwritable cache directory costs a warning, not the load") {
    write_plain(dir / "not_a_dir", {1});
    const auto again = dtrain::data::FashionMnist::load(dir.path(), dir / "not_a_dir" / "cache");
    CHECK(torch::equal(again.train().pixels(), first.train().pixels()));
  }
}

// ---------------------------------------------------------------------------------------------------
// TensorDataset

TEST_CASE("TensorDataset::get_batch returns the samples at the indices, in that order", "[data]") {
  const auto ds = numbered(10);
  CHECK(ds.size() == 10);
  const auto b = ds.get_batch(torch::tensor(std::vector<std::int64_t>{7, 2, 7, 0}));
  CHECK(to_vector(b.target) == std::vector<std::int64_t>{7, 2, 7, 0});
  CHECK(b.data.size(0) == 4);
  CHECK(b.data[1][1].item<float>() == 20.0f);
}

TEST_CASE("TensorDataset rejects data and targets of different lengths", "[data][error]") {
  REQUIRE_THROWS_MATCHES(dtrain::data::TensorDataset(torch::zeros({4, 2}), torch::zeros({3})),
                         dtrain::DataError, MessageContains({"4", "3"}));
  CHECK(dtrain::data::TensorDataset().size() == 0);
}

// ---------------------------------------------------------------------------------------------------
// data::batches

TEST_CASE("batches: batch_size at a time, the last one short, samples in the given order",
          "[data][batching]") {
  const auto ds = numbered(20);
  const std::vector<std::int64_t> order = {9, 3, 5, 0, 1, 2, 7, 19, 11, 4};

  SECTION("10 samples in batches of 4: 4, 4, 2") {
    std::vector<std::int64_t> sizes, seen;
    for (const auto& b : dtrain::data::batches(ds, order, 4)) {
      sizes.push_back(b.data.size(0));
      REQUIRE(b.target.size(0) == b.data.size(0));
      const auto t = to_vector(b.target);
      seen.insert(seen.end(), t.begin(), t.end());
      // data and targets stay paired: data row i is [i, 10 i] for target i.
      CHECK(torch::equal(b.data.select(1, 0).to(torch::kInt64), b.target));
    }
    CHECK(sizes == std::vector<std::int64_t>{4, 4, 2});
    CHECK(seen == order);
  }
  SECTION("a batch size that divides the count leaves no short batch") {
    std::vector<std::int64_t> sizes;
    for (const auto& b : dtrain::data::batches(ds, order, 5)) sizes.push_back(b.data.size(0));
    CHECK(sizes == std::vector<std::int64_t>{5, 5});
  }
  SECTION("a batch larger than the count gives one batch of everything") {
    std::vector<std::int64_t> sizes;
    for (const auto& b : dtrain::data::batches(ds, order, 64)) sizes.push_back(b.data.size(0));
    CHECK(sizes == std::vector<std::int64_t>{10});
  }
  SECTION("no indices, no batches") {
    CHECK(ranges::distance(dtrain::data::batches(ds, std::vector<std::int64_t>{}, 4)) == 0);
  }
}

TEST_CASE("batches is a range-v3 view: sized, composable, owning its indices", "[data][batching]") {
  const auto ds = numbered(20);
  auto make = [&] {
    // The index vector is a temporary: the view must keep its own copy alive.
    return dtrain::data::batches(ds, std::vector<std::int64_t>{4, 8, 15, 16, 2, 3, 1}, 3);
  };
  auto view = make();
  using View = decltype(view);
  STATIC_REQUIRE(ranges::view_<View>);
  STATIC_REQUIRE(ranges::sized_range<View>);
  STATIC_REQUIRE(ranges::random_access_range<View>);

  CHECK(ranges::distance(view) == 3);
  CHECK(ranges::size(view) == 3);

  // Composes with other views.
  std::vector<std::int64_t> firsts;
  for (const auto& b : view | ranges::views::take(2)) firsts.push_back(b.target[0].item<std::int64_t>());
  CHECK(firsts == std::vector<std::int64_t>{4, 16});

  // Random access gathers the same batch each time, and a copy of the view sees the same batches.
  const auto copy = view;
  CHECK(to_vector(view[2].target) == std::vector<std::int64_t>{1});
  CHECK(torch::equal(view[1].data, copy[1].data));
  CHECK(to_vector(copy[1].target) == std::vector<std::int64_t>{16, 2, 3});
}

// ------------------------------------------------------------------------------------------------
// data::prefetch (the CUDA transfer itself runs in tests/gpu; its ordering logic is here)

namespace {
// A transfer that records when each batch's move started and finished.
struct logging_transfer {
  std::vector<std::string>* log;
  dtrain::data::Batch start(dtrain::data::Batch b) const {
    log->push_back("start " + std::to_string(b.target[0].item<std::int64_t>()));
    return b;
  }
  dtrain::data::Batch finish(dtrain::data::Batch b) const {
    log->push_back("finish " + std::to_string(b.target[0].item<std::int64_t>()));
    return b;
  }
};
}  // namespace

TEST_CASE("prefetch yields the same batches in the same order, one transfer ahead", "[data][prefetch]") {
  const auto ds = numbered(10);
  auto batches = [&] {
    return ranges::views::iota(0, 5) | ranges::views::transform([&](int b) {
             return ds.get_batch(torch::arange(2 * b, 2 * b + 2, torch::kInt64));
           });
  };
  std::vector<std::string> log;
  int yielded = 0;
  std::vector<torch::Tensor> plain, prefetched;
  for (const auto& b : batches()) plain.push_back(b.target);
  for (const auto& b : dtrain::data::prefetch(batches(), logging_transfer{&log}, [&] { ++yielded; })) {
    // While the loop holds batch i, batch i+1's transfer has started (and no further one).
    const auto i = b.target[0].item<std::int64_t>();
    CHECK(log.back() == (i < 8 ? "start " + std::to_string(i + 2) : std::string("finish 8")));
    prefetched.push_back(b.target);
  }
  REQUIRE(prefetched.size() == plain.size());
  for (std::size_t i = 0; i < plain.size(); ++i) CHECK(torch::equal(prefetched[i], plain[i]));
  CHECK(yielded == 5);
  CHECK(log.front() == "start 0");
  CHECK(log[1] == "finish 0");
  CHECK(log[2] == "start 2");
  CHECK(log.size() == 10);

  // The CPU transfer hands batches through unchanged; an empty range yields nothing.
  int n = 0;
  for (const auto& b : dtrain::data::prefetch(batches(), dtrain::data::no_transfer{})) {
    CHECK(torch::equal(b.target, plain[n].clone()));
    ++n;
  }
  CHECK(n == 5);
  for (const auto& b : dtrain::data::prefetch(batches() | ranges::views::take(0), dtrain::data::no_transfer{})) {
    (void)b;
    FAIL("an empty range yielded a batch");
  }
}
