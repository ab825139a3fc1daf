// SPDX-License-Identifier: Apache-2.0
// Images: data::decode_image against PIL (bit for bit), data::resize against torchvision's Resize,
// stack_images against ToTensor + Normalize, data::ImageFolder against torchvision's ImageFolder
// (classes, files, order, labels), its errors, and an image pipeline's batches across loader
// thread counts and a resumed epoch. The references come from /usr/bin/python3 with PIL and
// torchvision (image_reference.py), run once per test process.

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <dtrain/data/fashion_mnist.hpp>
#include <dtrain/data/image.hpp>
#include <dtrain/data/image_folder.hpp>
#include <dtrain/data/image_transforms.hpp>
#include <dtrain/evaluation/image_inputs.hpp>
#include <dtrain/data/pipeline.hpp>
#include <dtrain/data/shard.hpp>
#include <dtrain/error.hpp>

#include "checkpoint_support.hpp"
#include "support.hpp"

namespace dd = dtrain::data;
namespace fs = std::filesystem;
using dtrain_test::MessageContains;
using dtrain_test::TempDir;

namespace {

// The references, made once: a directory of images and what PIL and torchvision make of them.
struct References {
  TempDir dir;
  nlohmann::json manifest;
  References() {
    const std::string cmd = "/usr/bin/python3 " DTRAIN_IMAGE_REFERENCE_SCRIPT " " + dir.path().string();
    if (std::system(cmd.c_str()) != 0)
      throw std::runtime_error("'" + cmd + "' failed: the image tests need /usr/bin/python3 with PIL and "
                               "torchvision (apt-get install python3-torchvision)");
    std::ifstream in(dir / "manifest.json");
    manifest = nlohmann::json::parse(in);
  }
};
const References& references() {
  static const References r;
  return r;
}

std::vector<std::uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
std::vector<std::uint8_t> bytes_of(const cv::Mat& m) {
  std::vector<std::uint8_t> out;
  for (int y = 0; y < m.rows; ++y) out.insert(out.end(), m.ptr<std::uint8_t>(y), m.ptr<std::uint8_t>(y) + m.cols * m.channels());
  return out;
}
int max_difference(const std::vector<std::uint8_t>& a, const std::vector<std::uint8_t>& b) {
  if (a.size() != b.size()) return 256;
  int worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(int(a[i]) - int(b[i])));
  return worst;
}

void write_text(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << text;
}
void copy_image(const std::string& name, const fs::path& to) {
  fs::create_directories(to.parent_path());
  fs::copy_file(references().dir / "images" / name, to);
}

// A classifier of 16x16 images that describes itself (checkpointer/model_config.hpp).
struct PixelsConfig {
  std::int64_t channels = 3, side = 16, classes = 2;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(PixelsConfig, channels, side, classes)
struct PixelsImpl : torch::nn::Module {
  using Config = PixelsConfig;
  explicit PixelsImpl(const Config& c) : config(c) {
    fc = register_module("fc", torch::nn::Linear(c.channels * c.side * c.side, c.classes));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc->forward(x.flatten(1)); }
  Config config;
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(Pixels);

}  // namespace

TEST_CASE("images: decode_image gives PIL's pixels bit for bit (PNG and JPEG grey colour alpha palette, 16-bit PNGs)", "[images]") {
  const auto& decode = references().manifest.at("decode");
  REQUIRE(decode.size() == 22);  // 8-bit and 16-bit PNGs, JPEGs, each as L and RGB
  for (const auto& e : decode) {
    const std::string file = e.at("file");
    const int channels = e.at("channels");
    INFO(file << " as " << (channels == 1 ? "L" : "RGB"));
    const auto m = dd::decode_image(file, channels);
    CHECK(m.rows == e.at("shape")[0].get<int>());
    CHECK(m.cols == e.at("shape")[1].get<int>());
    CHECK(m.channels() == channels);
    CHECK(max_difference(bytes_of(m), read_bytes(e.at("ref"))) == 0);
  }
}

TEST_CASE("images: resize equals torchvision's Resize on PIL images and is within one level of its antialiased tensor resize", "[images]") {
  const auto& resizes = references().manifest.at("resize");
  REQUIRE(resizes.size() == 20);
  for (const auto& e : resizes) {
    const std::string file = e.at("file");
    const auto size = e.at("size").get<std::vector<int>>();
    INFO(file << " channels " << e.at("channels").get<int>() << " to " << e.at("size").dump());
    dd::Image im{dd::decode_image(file, e.at("channels")), 0, file};
    const auto out = size.size() == 1 ? dd::resize(size[0])(im) : dd::resize(size[0], size[1])(im);
    CHECK(out.pixels.rows == e.at("shape")[0].get<int>());
    CHECK(out.pixels.cols == e.at("shape")[1].get<int>());
    const auto got = bytes_of(out.pixels);
    CHECK(max_difference(got, read_bytes(e.at("pil"))) == 0);
    CHECK(max_difference(got, read_bytes(e.at("tensor"))) <= 1);
  }
}

TEST_CASE("images: stack_images equals ToTensor then Normalize bit for bit", "[images]") {
  const auto& t = references().manifest.at("to_tensor");
  const std::string file = t.at("file");
  const auto batch = dd::stack_images{t.at("mean").get<std::vector<float>>(), t.at("std").get<std::vector<float>>()}(
      {dd::Image{dd::decode_image(file, 3), 4, file}, dd::Image{dd::decode_image(file, 3), 7, file}});
  const auto& image = batch["image"];
  REQUIRE(image.sizes() == torch::IntArrayRef({2, 3, 29, 31}));
  const auto ref_bytes = read_bytes(t.at("ref"));
  const auto ref = torch::from_blob(const_cast<std::uint8_t*>(ref_bytes.data()), {3, 29, 31}, torch::kFloat32);
  CHECK(torch::equal(image[0], ref));
  CHECK(torch::equal(image[1], ref));
  CHECK(torch::equal(batch["label"], torch::tensor({4, 7}, torch::kInt64)));
  CHECK_THROWS_MATCHES(dd::stack_images({0.5f, 0.5f}, {1.0f})({dd::Image{dd::decode_image(file, 3), 0, file}}),
                       dtrain::ConfigError, MessageContains({"mean and std need 1 or 3 values"}));
}

TEST_CASE("images: ImageFolder lists the classes files and labels of torchvision's ImageFolder in its order", "[images]") {
  const auto& f = references().manifest.at("folder");
  const dd::ImageFolder folder(f.at("root").get<std::string>(), {.channels = 3});
  CHECK(folder.classes() == f.at("classes").get<std::vector<std::string>>());
  const auto& samples = f.at("samples");
  REQUIRE(folder.size() == static_cast<std::int64_t>(samples.size()));
  for (std::int64_t i = 0; i < folder.size(); ++i) {
    CHECK(folder.path(i) == samples[static_cast<std::size_t>(i)][0].get<std::string>());
    CHECK(folder.label(i) == samples[static_cast<std::size_t>(i)][1].get<std::int64_t>());
  }
  const auto im = folder[3];  // b-cat/A.PNG: the grey PNG, read as RGB
  CHECK(im.label == 1);
  CHECK(im.pixels.channels() == 3);
  CHECK(im.pixels.rows == 37);
}

TEST_CASE("images: ImageFolder errors name the folder or file", "[images]") {
  TempDir tmp;
  CHECK_THROWS_MATCHES(dd::ImageFolder(tmp / "missing"), dtrain::DataError,
                       MessageContains({(tmp / "missing").string(), "not a directory"}));
  write_text(tmp / "flat" / "a.png", "x");
  CHECK_THROWS_MATCHES(dd::ImageFolder(tmp / "flat"), dtrain::DataError,
                       MessageContains({(tmp / "flat").string(), "holds no class directory"}));
  copy_image("grey.png", tmp / "some" / "cat" / "1.png");
  write_text(tmp / "some" / "dog" / "readme.txt", "only text here");
  CHECK_THROWS_MATCHES(dd::ImageFolder(tmp / "some"), dtrain::DataError,
                       MessageContains({"no image file in " + (tmp / "some" / "dog").string(), ".png"}));
  CHECK_THROWS_MATCHES(dd::ImageFolder(tmp / "some", {.channels = 2}), dtrain::ConfigError,
                       MessageContains({"channels must be 1 (grey) or 3 (RGB), got 2"}));

  // A file with an image's name that is not one, and a link to nothing: errors naming the file when
  // decoded, thrown in the loop at their batch's turn (nothing is skipped).
  const auto root = tmp / "bad";
  copy_image("grey.png", root / "a" / "1.png");
  copy_image("grey.png", root / "a" / "2.png");
  write_text(root / "a" / "3.png", "this is not a PNG");
  fs::create_directories(root / "b");
  fs::create_symlink(root / "nowhere.png", root / "b" / "4.png");
  const dd::ImageFolder bad(root, {.channels = 1});
  REQUIRE(bad.size() == 4);
  CHECK(bad[0].pixels.rows == 37);
  CHECK_THROWS_MATCHES(bad[2], dtrain::DataError, MessageContains({(root / "a" / "3.png").string(), "not an image"}));
  CHECK_THROWS_MATCHES(bad[3], dtrain::DataError, MessageContains({(root / "b" / "4.png").string(), "cannot be read"}));
  CHECK_THROWS_MATCHES(bad[4], dtrain::DataError, MessageContains({"image 4 is outside [0, 4)"}));
  const auto ds = dd::pipelined(bad, dd::collate(dd::stack_images{}), {.loader_threads = 2});
  int seen = 0;
  try {
    for (const auto& b : dd::batches(ds, {0, 1, 2, 3}, 2)) seen += static_cast<int>(b.size());
    FAIL("the batch holding a.3.png did not throw");
  } catch (const dtrain::DataError& e) {
    CHECK_THAT(e, MessageContains({(root / "a" / "3.png").string()}));
  }
  CHECK(seen == 2);  // the first batch came through
  // A PNG cut short (a copy interrupted): named a damaged PNG, not a file to rename.
  {
    std::ifstream in(references().dir / "images" / "rgb.png", std::ios::binary);
    const std::string whole((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const auto cut = tmp / "cut.png";
    std::ofstream(cut, std::ios::binary) << whole.substr(0, whole.size() / 2);
    CHECK_THROWS_MATCHES(dd::decode_image(cut.string(), 3), dtrain::DataError,
                         MessageContains({cut.string(), "a PNG file OpenCV cannot decode", "truncated or damaged"}));
  }
  const dd::center_crop too_big{40, 20};
  CHECK_THROWS_MATCHES(too_big(bad[0]), dtrain::DataError,
                       MessageContains({(root / "a" / "1.png").string(), "37x23", "resize before cropping"}));
}

namespace {

// 4 classes x 6 copies of the reference images, in sizes that need resizing to one.
fs::path augmentation_folder(const TempDir& tmp) {
  const std::vector<std::string> sources = {"grey.png", "rgb.png", "rgb.jpg", "palette.png", "rgba.png", "grey.jpg"};
  for (int c = 0; c < 4; ++c)
    for (std::size_t k = 0; k < sources.size(); ++k)
      copy_image(sources[(k + static_cast<std::size_t>(c)) % sources.size()],
                 tmp / "aug" / ("class" + std::to_string(c)) / (std::to_string(k) + "." + sources[k].substr(sources[k].size() - 3)));
  return tmp / "aug";
}

auto augmenting(const dd::ImageFolder& folder, int threads) {
  return dd::pipelined(folder,
                       dd::map(dd::resize(20, 20)) | dd::map(dd::random_crop{16, 16, 2}) |
                           dd::map(dd::random_horizontal_flip{0.5}) | dd::collate(dd::stack_images{{0.5f}, {0.25f}}),
                       {.loader_threads = threads, .seed = 5});
}

std::vector<dd::Fields> epoch_batches(const dd::ImageFolder& folder, int threads, std::int64_t epoch, std::int64_t first = 0) {
  const auto ds = augmenting(folder, threads);
  std::vector<std::int64_t> order;
  for (std::int64_t i = 0; i < folder.size(); ++i) order.push_back((i * 7) % folder.size());
  std::vector<dd::Fields> out;
  for (const auto& b : dd::batches(ds, order, 5, first, {}, epoch)) out.push_back(b);
  return out;
}

bool same(const std::vector<dd::Fields>& a, const std::vector<dd::Fields>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!torch::equal(a[i]["image"], b[i]["image"]) || !torch::equal(a[i]["label"], b[i]["label"])) return false;
  return true;
}

}  // namespace

TEST_CASE("images: an augmenting pipeline gives the same batches on 0 1 and 3 loader threads and after a resume", "[images]") {
  TempDir tmp;
  const dd::ImageFolder folder(augmentation_folder(tmp), {.channels = 3});
  REQUIRE(folder.size() == 24);
  const auto inline_batches = epoch_batches(folder, 0, 0);
  REQUIRE(inline_batches.size() == 5);
  CHECK(inline_batches[0]["image"].sizes() == torch::IntArrayRef({5, 3, 16, 16}));
  CHECK(inline_batches[4]["image"].size(0) == 4);
  CHECK(same(inline_batches, epoch_batches(folder, 1, 0)));
  CHECK(same(inline_batches, epoch_batches(folder, 3, 0)));
  // A resumed epoch (from batch 2) draws what the whole epoch drew for those batches.
  const auto resumed = epoch_batches(folder, 2, 0, 2);
  CHECK(same(resumed, std::vector<dd::Fields>(inline_batches.begin() + 2, inline_batches.end())));
  // The draws are real: another epoch crops and flips otherwise, with the same labels.
  const auto next = epoch_batches(folder, 2, 1);
  CHECK_FALSE(torch::equal(next[0]["image"], inline_batches[0]["image"]));
  CHECK(torch::equal(next[0]["label"], inline_batches[0]["label"]));
}

TEST_CASE("images: random_horizontal_flip mirrors about half the images and center_crop rounds as Python", "[images]") {
  cv::Mat m(3, 5, CV_8UC1);
  for (int x = 0; x < 5; ++x)
    for (int y = 0; y < 3; ++y) m.at<std::uint8_t>(y, x) = static_cast<std::uint8_t>(10 * x + y);
  int flipped = 0;
  for (int i = 0; i < 400; ++i) {
    auto g = at::detail::createCPUGenerator(static_cast<std::uint64_t>(i));
    const auto out = dd::random_horizontal_flip{0.5}(dd::Image{m, 0, "m"}, g);
    flipped += out.pixels.at<std::uint8_t>(0, 0) == 40;
  }
  CHECK(flipped > 160);
  CHECK(flipped < 240);
  // 5 - 2 = 3 columns to lose: Python's round(1.5) = 2 on the left; 3 - 2 = 1 row: round(0.5) = 0 on top.
  const dd::center_crop crop{2, 2};
  const auto c = crop(dd::Image{m, 0, "m"});
  CHECK(c.pixels.at<std::uint8_t>(0, 0) == 20);
}

TEST_CASE("images: scripts/make-image-folder read back through ImageFolder gives the IDX files' tensors and labels", "[images]") {
  // What the image classifier trains on equals what fashion_mnist trains on from the IDX files:
  // the same normalised pixels, the same labels, for every image of a 20-per-class slice. The IDX
  // loader fuses the normalisation (x * (1 / (255 std)) - mean / std), so the floats may differ in
  // the last bits: 1e-5 is a thousandth of one grey level (1 / (255 * 0.353) = 0.011).
  TempDir tmp;
  const std::string cmd = "/usr/bin/python3 " DTRAIN_MAKE_IMAGE_FOLDER " " + (tmp / "f").string() + " --per-class 20 > /dev/null";
  REQUIRE(std::system(cmd.c_str()) == 0);
  const auto idx = dd::FashionMnist::load();
  for (const auto& [split, tensors] : {std::pair{"train", idx.train()}, std::pair{"test", idx.test()}}) {
    const dd::ImageFolder folder(tmp / "f" / split, {.channels = 1});
    REQUIRE(folder.size() == 200);
    CHECK(folder.classes().front() == "0-t-shirt-top");
    std::vector<dd::Image> images;
    std::vector<std::int64_t> rows;
    for (std::int64_t i = 0; i < folder.size(); ++i) {
      images.push_back(folder[i]);
      rows.push_back(std::stoll(fs::path(folder.path(i)).stem().string()));  // <index>.png: its IDX row
    }
    const auto batch = dd::stack_images{{0.2860f}, {0.3530f}}(images);
    const auto at = torch::tensor(rows, torch::kInt64);
    CHECK(torch::equal(batch["label"], tensors.targets().index_select(0, at).to(torch::kInt64)));
    const auto want = tensors.data().index_select(0, at).to(torch::kFloat32);
    INFO(split << ": largest difference " << (batch["image"] - want).abs().max().item<double>());
    CHECK(torch::allclose(batch["image"], want, /*rtol=*/0, /*atol=*/1e-5));
  }
}

TEST_CASE("images: ImageTransforms is evaluation's preprocessing as data, and a Predictor restored from a checkpoint applies "
          "it to raw files bitwise", "[images][predictor]") {
  const auto& f = references().manifest.at("folder");
  const std::string root = f.at("root");
  const auto eval = dd::ImageTransforms(3).resize(20).center_crop(16).normalize({0.5f, 0.4f, 0.3f}, {0.2f, 0.25f, 0.3f});
  const auto test = dd::pipelined(dd::ImageFolder(root, {.channels = 3}), dd::map(eval) | dd::collate(eval.to_tensor()));
  const auto n = test.size();
  const auto batch = test.get_batch(torch::arange(n));
  REQUIRE(batch["image"].sizes() == torch::IntArrayRef({n, 3, 16, 16}));
  std::vector<std::string> files;
  for (std::int64_t i = 0; i < n; ++i) files.push_back(test.source().path(i));
  CHECK(torch::equal(eval.load(files), batch["image"]));  // the same steps, outside a pipeline

  // As data: JSON and a checkpoint object, both ways.
  CHECK(dd::ImageTransforms::from_json(eval.to_json()) == eval);
  CHECK(eval.to_json()["steps"] == nlohmann::json::parse(
                                       R"([{"op":"resize","height":20,"width":0},{"op":"center_crop","height":16,"width":16}])"));
  CHECK_THROWS_MATCHES(dd::ImageTransforms::from_json({{"channels", 3}, {"steps", {{{"op", "rotate"}, {"height", 1}, {"width", 1}}}},
                                                       {"mean", {0.0}}, {"std", {1.0}}}),
                       dtrain::DataError, MessageContains({"ImageTransforms", "unknown step \"rotate\""}));
  CHECK_THROWS_MATCHES(dd::ImageTransforms::from_json({{"channels", 2}}), dtrain::DataError, MessageContains({"channels"}));
  CHECK_THROWS_MATCHES(dd::ImageTransforms(3).normalize({0.5f, 0.5f}, {1.0f}), dtrain::ConfigError,
                       MessageContains({"mean and std need 1 or 3 values"}));
  CHECK(dd::ImageTransforms(1).load({files[0]}).size(1) == 1);  // decoded with the transforms' channels
  const dd::ImageTransforms grey(1);
  CHECK_THROWS_MATCHES(grey(dd::Image{dd::decode_image(files[0], 3), 0, files[0]}), dtrain::DataError,
                       MessageContains({files[0], "3-channel image", "1-channel"}));

  // The checkpoint carries the transforms and the class names: a checkpoint alone serves files.
  TempDir dir;
  torch::manual_seed(11);
  const auto classes = test.source().classes();
  Pixels model(PixelsConfig{.channels = 3, .side = 16, .classes = static_cast<std::int64_t>(classes.size())});
  const auto labels = dd::LabelEncoder::fit(classes);
  CHECK(labels.classes() == classes);  // sorted both: class k keeps its name
  const auto path = dtrain_test::save_checkpoint(dir / "run", *model, [&](auto& s) {
    s.model_config = dtrain::checkpointer::describe_model(model);
    s.with_object("transforms", eval).with_object("labels", labels);
  });
  auto predictor = dtrain::evaluation::Predictor<Pixels>::from_checkpoint(path, dtrain::evaluation::ImageInputs{});
  const auto p = predictor.predict(files);
  model->eval();
  torch::NoGradGuard no_grad;
  CHECK(torch::equal(p.probabilities(), torch::softmax(model->forward(batch["image"]), 1)));
  CHECK(p.class_names() == classes);
  CHECK_THROWS_MATCHES(predictor.predict(std::vector<std::string>{root + "/missing.png"}), dtrain::DataError,
                       MessageContains({"missing.png", "cannot be read"}));
}
