// SPDX-License-Identifier: Apache-2.0
// docs/data.md's image block: an image folder (the first Fashion-MNIST images, written as PNG
// class folders here), decoded by loader threads, flipped and normalised, trained on by 2 workers
// and evaluated. A program of its own: it needs OpenCV (dtrain::images). `snippets_images folder`.

#include "snippets.hpp"

// [includes]
#include <dtrain/dtrain.hpp>
#include <dtrain/data.hpp>
#include <dtrain/data/image_folder.hpp>  // needs OpenCV: link dtrain::images
// [includes]

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>

#include <opencv2/imgcodecs.hpp>

namespace {

// images/{train,test}/<label>/<index>.png: 300 and 200 of Fashion-MNIST's images, as 8-bit PNGs.
void write_folder() {
  const auto all = dtrain::data::FashionMnist::load();
  auto write = [](const dtrain::data::NormalizedImages& d, std::int64_t n, const std::string& dir) {
    for (std::int64_t i = 0; i < n; ++i) {
      const auto pixels = d.pixels()[i][0].contiguous();  // the image's bytes, as read
      const auto cls = std::filesystem::path(dir) / std::to_string(d.targets()[i].item<std::int64_t>());
      std::filesystem::create_directories(cls);
      cv::imwrite((cls / (std::to_string(i) + ".png")).string(), cv::Mat(28, 28, CV_8UC1, pixels.data_ptr<std::uint8_t>()));
    }
  };
  std::filesystem::remove_all("images");
  std::filesystem::remove_all("runs");
  write(all.train(), 300, "images/train");
  write(all.test(), 200, "images/test");
}

using snippets::Net;

int folder() {
  if (!std::getenv("RANK")) write_folder();  // the driver; its workers read what it wrote
  // [images]
  namespace data = dtrain::data;
  // ROOT/<class>/<image>: the paths are listed now, the images decoded later by the loader threads.
  const data::ImageFolder train_images("images/train", {.channels = 1});
  const data::ImageFolder test_images("images/test", {.channels = 1});
  const data::stack_images normalise{{0.2860f}, {0.3530f}};  // ToTensor + Normalize(mean, std)
  auto train = data::pipelined(train_images,
                               data::map(data::random_horizontal_flip{0.5}) | data::collate(normalise),
                               {.loader_threads = 2});
  const auto test = data::pipelined(test_images, data::collate(normalise));

  using Trainer = dtrain::Trainer<Net, decltype(train), dtrain::checkpointer::directory<>>;
  Trainer trainer({.num_workers = 2}, {.storage_path = "runs", .name = "images"});
  auto result = trainer.fit([&](Trainer::context& ctx) {
    auto model = ctx.prepare_model(Net{});
    torch::optim::SGD opt(ctx.parameters(model), torch::optim::SGDOptions(0.05).momentum(0.9));
    if (auto ck = ctx.get_checkpoint()) {
      ctx.restore(*ck, model, opt);
      ck->load_object("pipeline", train.random_state());  // the flips' seed
    }
    for (auto epoch : ctx.epochs(4)) {
      model->train();
      for (const auto& b : ctx.shard(train, 64)) {  // b["image"]: [32, 1, 28, 28] per worker
        opt.zero_grad();
        ctx.backward(torch::nn::functional::cross_entropy(ctx.forward(model, b["image"]), b["label"]));
        ctx.step(opt);
      }
      model->eval();
      const auto v = dtrain::evaluation::validate(ctx, test, 128, [&](const data::Fields& b) {
        return dtrain::evaluation::Scored{ctx.forward(model, b["image"]), b["label"]};
      });
      ctx.report({{"epoch", epoch}, {"test_accuracy", v.accuracy}},
                 ctx.checkpoint(model, opt).with_object("pipeline", train.random_state()));
    }
  });
  // [images]
  std::cout << "images: " << train_images.classes().size() << " classes, " << train_images.size()
            << " training images, test_accuracy " << result.metrics.at("test_accuracy").number() << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string block = argc > 1 ? argv[1] : "";
  if (block == "folder") return folder();
  std::cerr << "usage: snippets_images folder\n";
  return 2;
}
