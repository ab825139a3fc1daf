// SPDX-License-Identifier: Apache-2.0
// docs/models.md's ViT block: a ViTForImageClassification's directory (config.json,
// model.safetensors, preprocessor_config.json) and an image folder; the images go through the
// model's ViTImageProcessor, the backbone's weights load, a new head for the folder's classes is
// fine-tuned on 2 workers, and the checkpoint is exported as a directory transformers loads.
//   snippets_vit MODEL_DIR IMAGE_FOLDER
// (tests/docs: the small random ViT of tests/unit/vit_reference.py and Fashion-MNIST's PNGs.)

#include <dtrain/data/image_folder.hpp>  // needs OpenCV: link dtrain::images
#include <dtrain/data/vit_image_processor.hpp>
#include <dtrain/evaluation/image_inputs.hpp>  // ImageInputs: OpenCV too
#include <dtrain/all.hpp>

#include <iostream>

int main(int argc, char** argv) try {
  if (argc != 3) {
    std::cerr << "usage: snippets_vit MODEL_DIR IMAGE_FOLDER\n";
    return 2;
  }
  // [vit fine-tune]
  const std::filesystem::path pretrained = argv[1];  // a ViTForImageClassification's directory
  const auto processor = dtrain::data::ViTImageProcessor::from_pretrained(pretrained);
  const dtrain::data::ImageFolder folder(argv[2], {.channels = processor.channels});
  std::vector<std::string> files;
  std::vector<std::int64_t> labels;
  for (std::int64_t i = 0; i < folder.size(); ++i) files.push_back(folder.path(i)), labels.push_back(folder.label(i));
  const dtrain::data::TensorDataset images{processor.load(files), torch::tensor(labels)};  // pixel_values [N, 3, H, W]

  auto config = dtrain::nn::ViTConfig::from_pretrained(pretrained);
  config.id2label = folder.classes();  // the folder's classes: a new classifier
  const auto labels_of = dtrain::data::LabelEncoder::fit(folder.classes());  // saved for serving
  using ViT = dtrain::nn::ViTForImageClassification;
  using Trainer = dtrain::Trainer<ViT, dtrain::data::TensorDataset, dtrain::checkpointer::directory<>>;
  Trainer trainer({.num_workers = 2}, {.storage_path = "runs", .name = "vit", .start = dtrain::Start::fresh});
  const auto result = trainer.fit([&](Trainer::context& ctx) {
    ViT vit(config);
    dtrain::nn::load_pretrained(*vit->vit, pretrained);  // the backbone's weights; the head is new
    auto model = ctx.prepare_model(vit);
    torch::optim::AdamW opt(ctx.parameters(model), torch::optim::AdamWOptions(1e-3));
    for (auto epoch : ctx.epochs(2)) {
      model->train();
      double loss_sum = 0;
      int steps = 0;
      for (auto batch : ctx.shard(images, 32)) {
        opt.zero_grad();
        auto loss = torch::nn::functional::cross_entropy(ctx.forward(model, batch.data), batch.target);
        ctx.backward(loss);
        ctx.step(opt);
        loss_sum += loss.item<double>();
        ++steps;
      }
      ctx.report({{"epoch", epoch}, {"loss", ctx.all_reduce(loss_sum / steps)}},
                 ctx.checkpoint(model, opt).with_object("transforms", processor).with_object("labels", labels_of));
    }
  });
  // Back to Python: the checkpoint's model as a Hugging Face directory, with its image processor.
  const auto& checkpoint = *result.latest_checkpoint();
  auto tuned = dtrain::checkpointer::build_model<ViT>(checkpoint);
  checkpoint.load_model(tuned);
  dtrain::nn::save_pretrained(*tuned, "vit-fashion", {.files = {pretrained / "preprocessor_config.json"}});
  // [vit fine-tune]
  std::cout << "vit: " << result.metrics_history.size() << " reports, loss " << result.metrics.at("loss").text()
            << ", exported " << dtrain::weights::read("vit-fashion").size() << " tensors, labels "
            << dtrain::nn::ViTConfig::from_pretrained("vit-fashion").id2label.size() << "\n";
  // [vit serve]
  // The checkpoint alone serves image files: the model from its config, the ViTImageProcessor and
  // the class names it saved (ImageInputs reads which preprocessing that is from the checkpoint).
  using Predictor = dtrain::evaluation::Predictor<dtrain::nn::ViTForImageClassification>;
  auto predictor = Predictor::from_checkpoint(checkpoint.path(), dtrain::evaluation::ImageInputs{});
  const auto p = predictor.predict({files[0], files[1]});  // p[i].label, p[i].probabilities, p.logits()
  // Every file of the folder scored on 2 workers: predictions/predictions.csv, in the files' order.
  const auto job = dtrain::evaluation::batch_predict<dtrain::nn::ViTForImageClassification>(
      checkpoint.path(), files, dtrain::evaluation::ImageInputs{},
      {.output = "predictions", .start = dtrain::Start::fresh}, {.num_workers = 2});
  // [vit serve]
  std::cout << "served: " << (p[0].label == folder.classes()[0] ? "first class" : "another class") << ", logits "
            << p.logits().sizes() << ", batch " << job.samples << " files of " << job.class_names.size()
            << " classes\n";
  return 0;
} catch (const std::exception& e) {
  std::cerr << "snippets_vit: " << e.what() << "\n";
  return 1;
}
