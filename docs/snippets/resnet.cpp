// SPDX-License-Identifier: Apache-2.0
// docs/models.md's ResNet block: torchvision's resnet18 weights (a torch.save state_dict, the
// program's argument) fine-tuned with a new 3-class head on 2 workers; the checkpoint's model.pt
// then loads strictly into torchvision. The data: 48 random 3x64x64 images whose label shifts the
// mean of one colour channel (a stand-in for an image folder).
//   snippets_resnet RESNET18_STATE_DICT

#include "snippets.hpp"

#include <iostream>

int main(int argc, char** argv) try {
  if (argc != 2) {
    std::cerr << "usage: snippets_resnet FILE (torchvision's resnet18 state_dict, by torch.save)\n";
    return 2;
  }
  const auto images = [] {
    auto gen = at::detail::createCPUGenerator(18);
    auto labels = at::arange(48) % 3;
    auto x = at::randn({48, 3, 64, 64}, gen);
    for (std::int64_t i = 0; i < 48; ++i) x[i][labels[i].item<std::int64_t>()].add_(1.0);
    return dtrain::data::TensorDataset{x, labels};
  }();
  // [resnet fine-tune]
  const std::filesystem::path pretrained = argv[1];  // torch.save(torchvision.models.resnet18(weights=...).state_dict(), ...)
  using ResNet = dtrain::nn::ResNet;
  using Trainer = dtrain::Trainer<ResNet, dtrain::data::TensorDataset, dtrain::strategy::ddp<>,
                                  dtrain::checkpointer::directory<>>;
  Trainer trainer({.num_workers = 2}, {.storage_path = "runs", .name = "resnet18", .start = dtrain::Start::fresh});
  const auto result = trainer.fit([&](Trainer::context& ctx) {
    auto resnet = dtrain::nn::resnet18(/*num_classes=*/3);
    dtrain::nn::load_pretrained(resnet, pretrained);  // strict; only fc (1000 classes in the file) stays new
    auto model = ctx.prepare_model(resnet);
    torch::optim::SGD opt(ctx.parameters(model), torch::optim::SGDOptions(0.01).momentum(0.9));
    for (auto epoch : ctx.epochs(2)) {
      model->train();
      double loss_sum = 0;
      int steps = 0;
      for (auto batch : ctx.shard(images, 16)) {  // batch.data: [8, 3, 64, 64] on each of the 2 workers
        opt.zero_grad();
        auto loss = torch::nn::functional::cross_entropy(ctx.forward(model, batch.data), batch.target);
        ctx.backward(loss);
        ctx.step(opt);
        loss_sum += loss.item<double>();
        ++steps;
      }
      ctx.report({{"epoch", epoch}, {"loss", ctx.all_reduce(loss_sum / steps)}}, ctx.checkpoint(model, opt));
    }
  });
  // Back to Python: model.pt is a state_dict with torchvision's names, BatchNorm statistics included.
  const auto model_pt = result.latest_checkpoint()->path() / "model.pt";
  // [resnet fine-tune]
  std::cout << "resnet: " << result.metrics_history.size() << " reports, loss " << result.metrics.at("loss").text()
            << ", " << dtrain::weights::read(model_pt).size() << " tensors in model.pt\n"
            << "model.pt: " << model_pt.string() << "\n";
  // [resnet serve]
  // The checkpoint alone: the ResNet rebuilt from its model_config.json (depth, classes) and loaded.
  const auto best = result.latest_checkpoint()->path();
  auto predictor = dtrain::evaluation::Predictor<dtrain::nn::ResNet>::from_checkpoint(best);
  const auto p = predictor.predict(images.get_batch(torch::arange(4)).data);  // p.logits(): [4, 3]
  // [resnet serve]
  std::cout << "served: logits " << p.logits().sizes() << ", probabilities " << p.probabilities().sizes() << "\n";
  return 0;
} catch (const std::exception& e) {
  std::cerr << "snippets_resnet: " << e.what() << "\n";
  return 1;
}
