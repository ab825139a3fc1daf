// SPDX-License-Identifier: Apache-2.0
// The dog-breed workload of Ray Train's multimodal tutorial in C++: an image folder ROOT/{train,
// val,test}/<breed>/<images>; a pretrained CLIP's image features computed inside the data pipeline
// by a stage over a class (data::map_batches<ClipEmbed>: the model loaded once per instance,
// --concurrency instances, --embed-batch rows a call) on the loader threads, while the trainer
// consumes the batches before; the tutorial's head on the embeddings (Linear -> 256, BatchNorm1d,
// ReLU, Dropout 0.3, Linear -> breeds), Adam with ReduceLROnPlateau on the validation loss, on N
// workers, every epoch logged to MLflow (tracker::mlflow<>) and checkpointed with the class map,
// the best kept by val_loss; then the test split scored through the same pipeline by batch_predict
// on N workers, and the multi-label confusion matrix (TN, FP, FN, TP per breed) with precision,
// recall and F1. One JSON line.
//
//   dog_breeds --model-dir DIR --data ROOT [--workers N] [--epochs N] [--batch N] [--lr X]
//       [--lr-factor X] [--lr-patience N] [--concurrency N] [--embed-batch N] [--loader-threads N]
//       [--threads-per-worker N] [--seed N] [--storage-path DIR] [--name NAME]
//
// --model-dir: a CLIPModel directory (config.json, model.safetensors, preprocessor_config.json);
// examples/make_dog_breeds.py makes one with random weights (and a folder of generated images).

#include <dtrain/data/clip_image_processor.hpp>  // needs OpenCV: link dtrain::images
#include <dtrain/data/image_folder.hpp>
#include <dtrain/data.hpp>
#include <dtrain/dtrain.hpp>
#include <dtrain/evaluation/batch_predict.hpp>
#include <dtrain/evaluation/classification.hpp>
#include <dtrain/evaluation/validation.hpp>
#include <dtrain/nn/clip.hpp>
#include <dtrain/schedule/plateau.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

namespace data = dtrain::data;
namespace fs = std::filesystem;

namespace {

constexpr const char* kUsage =
    "usage: dog_breeds --model-dir DIR --data ROOT [--workers N] [--epochs N] [--batch N] [--lr X]\n"
    "       [--lr-factor X] [--lr-patience N] [--concurrency N] [--embed-batch N] [--loader-threads N]\n"
    "       [--threads-per-worker N] [--seed N] [--storage-path DIR] [--name NAME]\n";

struct Options {
  fs::path model_dir, data_dir;
  std::string storage = "dog_breeds_runs", name = "dog_breeds";
  std::int64_t workers = 2, epochs = 20, batch = 256, lr_patience = 3, concurrency = 1, embed_batch = 64,
               loader_threads = 2, threads = 1, seed = 0;
  double lr = 1e-3, lr_factor = 0.8;
};

Options parse(int argc, char** argv) {
  Options o;
  const auto integer = [](const std::string& flag, const std::string& v, std::int64_t low) {
    std::size_t end = 0;
    std::int64_t n = 0;
    try {
      n = std::stoll(v, &end);
    } catch (const std::exception&) {
      end = 0;
    }
    if (v.empty() || end != v.size() || n < low)
      throw std::invalid_argument(flag + " needs an integer >= " + std::to_string(low) + ", got '" + v + "'");
    return n;
  };
  const auto real = [](const std::string& flag, const std::string& v, double above, double below) {
    std::size_t end = 0;
    double x = 0;
    try {
      x = std::stod(v, &end);
    } catch (const std::exception&) {
      end = 0;
    }
    if (v.empty() || end != v.size() || !(x > above && x < below))
      throw std::invalid_argument(flag + " needs a number in (" + std::to_string(above) + ", " + std::to_string(below) +
                                  "), got '" + v + "'");
    return x;
  };
  for (int i = 1; i < argc; i += 2) {
    const std::string f = argv[i];
    if (i + 1 >= argc) throw std::invalid_argument(f + " needs a value");
    const std::string v = argv[i + 1];
    if (f == "--model-dir") o.model_dir = v;
    else if (f == "--data") o.data_dir = v;
    else if (f == "--workers") o.workers = integer(f, v, 1);
    else if (f == "--epochs") o.epochs = integer(f, v, 1);
    else if (f == "--batch") o.batch = integer(f, v, 1);
    else if (f == "--lr") o.lr = real(f, v, 0, 1e3);
    else if (f == "--lr-factor") o.lr_factor = real(f, v, 0, 1);
    else if (f == "--lr-patience") o.lr_patience = integer(f, v, 0);
    else if (f == "--concurrency") o.concurrency = integer(f, v, 1);
    else if (f == "--embed-batch") o.embed_batch = integer(f, v, 1);
    else if (f == "--loader-threads") o.loader_threads = integer(f, v, 0);
    else if (f == "--threads-per-worker") o.threads = integer(f, v, 1);
    else if (f == "--seed") o.seed = integer(f, v, 0);
    else if (f == "--storage-path") o.storage = v;
    else if (f == "--name") o.name = v;
    else throw std::invalid_argument("unknown flag " + f);
  }
  if (o.model_dir.empty() || o.data_dir.empty()) throw std::invalid_argument("--model-dir and --data are required");
  if (o.workers > 4096 || o.concurrency > 64) throw std::invalid_argument("--workers at most 4096, --concurrency at most 64");
  if (o.batch % o.workers) throw std::invalid_argument("--batch (the global batch) must be a multiple of --workers");
  return o;
}

/// The tutorial's ClassificationModel: embedding -> hidden (BatchNorm1d, ReLU, Dropout) -> breeds.
struct HeadConfig {
  std::int64_t embedding_dim = 512, hidden_dim = 256, num_classes = 0;
  double dropout_p = 0.3;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(HeadConfig, embedding_dim, hidden_dim, num_classes, dropout_p)

struct BreedHeadImpl : torch::nn::Module {
  using Config = HeadConfig;
  explicit BreedHeadImpl(const Config& c) : config(c) {
    fc1 = register_module("fc1", torch::nn::Linear(c.embedding_dim, c.hidden_dim));
    batch_norm = register_module("batch_norm", torch::nn::BatchNorm1d(c.hidden_dim));
    dropout = register_module("dropout", torch::nn::Dropout(c.dropout_p));
    fc2 = register_module("fc2", torch::nn::Linear(c.hidden_dim, c.num_classes));
  }
  torch::Tensor forward(const torch::Tensor& embedding) { return fc2(dropout(torch::relu(batch_norm(fc1(embedding))))); }
  /// A pipeline's batch (what the Predictor and batch_predict give): its "embedding" column.
  torch::Tensor forward(const data::Fields& batch) { return forward(batch["embedding"]); }

  Config config;
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::BatchNorm1d batch_norm{nullptr};
  torch::nn::Dropout dropout{nullptr};
};
TORCH_MODULE(BreedHead);

/// The embedding stage (Ray Data's callable class): a CLIP loaded once per instance, the image
/// features of each batch of pixel_values added, the images dropped.
struct ClipEmbed {
  explicit ClipEmbed(const fs::path& dir) : clip(dtrain::nn::CLIPConfig::from_pretrained(dir)) {
    dtrain::nn::load_pretrained(clip, dir);
    clip->eval();
  }
  data::Fields operator()(data::Fields batch) {  // under c10::InferenceMode (the stage's)
    batch.set("embedding", clip->get_image_features(batch["image"]));
    batch.erase("image");
    return batch;
  }
  dtrain::nn::CLIPModel clip;
};

void check_model_dir(const fs::path& dir) {
  for (const char* file : {"config.json", "model.safetensors", "preprocessor_config.json"})
    if (!fs::exists(dir / file))
      throw dtrain::ConfigError("--model-dir " + dir.string() + ": no " + file +
                                "; a CLIPModel directory holds config.json, model.safetensors and "
                                "preprocessor_config.json (transformers' CLIPModel and CLIPImageProcessor save_pretrained)");
}

}  // namespace

int main(int argc, char** argv) try {
  const auto program_start = std::chrono::steady_clock::now();
  Options o;
  try {
    o = parse(argc, argv);
  } catch (const std::invalid_argument& e) {
    std::cerr << "dog_breeds: " << e.what() << "\n" << kUsage;
    return 2;
  }
  torch::set_num_threads(static_cast<int>(o.threads));
  check_model_dir(o.model_dir);
  const auto clip_config = dtrain::nn::CLIPConfig::from_pretrained(o.model_dir);
  const auto processor = data::CLIPImageProcessor::from_pretrained(o.model_dir);
  const data::ImageFolder train_folder(o.data_dir / "train"), val_folder(o.data_dir / "val"), test_folder(o.data_dir / "test");
  for (const auto* split : {"val", "test"})
    if ((std::string(split) == "val" ? val_folder : test_folder).classes() != train_folder.classes())
      throw dtrain::DataError((o.data_dir / split).string() + ": its breeds are not those of " +
                              (o.data_dir / "train").string() + "; every split needs the same class folders");
  const auto labels = data::LabelEncoder::fit(train_folder.classes());  // the class map, saved with the model

  // One pipeline: decode, CLIP's resize and crop, collate, then the embeddings. One stage object in
  // the three splits' pipelines: a worker's CLIP instances serve all three.
  const auto embed = data::map_batches<ClipEmbed>(
      {.concurrency = static_cast<int>(o.concurrency), .batch_size = o.embed_batch, .name = "clip"}, o.model_dir);
  const auto pipeline = data::map(processor) | data::collate(processor.collate()) | embed;
  const data::PipelineOptions loading{.loader_threads = static_cast<int>(o.loader_threads),
                                      .seed = static_cast<std::uint64_t>(o.seed)};
  const auto train = data::pipelined(train_folder, pipeline, loading);
  const auto val = data::pipelined(val_folder, pipeline, loading);
  const auto test = data::pipelined(test_folder, pipeline, loading);

  const HeadConfig head{.embedding_dim = clip_config.projection_dim,
                        .num_classes = static_cast<std::int64_t>(train_folder.classes().size())};
  using Trainer =
      dtrain::Trainer<BreedHead, std::decay_t<decltype(train)>, dtrain::checkpointer::directory<>, dtrain::tracker::mlflow<>>;
  dtrain::RunConfig run{.storage_path = o.storage, .name = o.name};
  run.start = dtrain::Start::fresh;
  run.seed = static_cast<std::uint64_t>(o.seed);
  run.checkpoint = {.num_to_keep = 1, .score_attribute = "val_loss", .score_order = dtrain::ScoreOrder::min};
  run.train_loop_config = {{"model", "clip head"}, {"batch", o.batch},         {"epochs", o.epochs},
                           {"lr", o.lr},           {"lr_factor", o.lr_factor}, {"lr_patience", o.lr_patience},
                           {"concurrency", o.concurrency}, {"embed_batch", o.embed_batch}};
  Trainer trainer({.num_workers = static_cast<int>(o.workers), .threads_per_worker = static_cast<int>(o.threads)}, run);
  const auto started = std::chrono::steady_clock::now();
  auto result = trainer.fit([&](Trainer::context& ctx) {
    torch::manual_seed(static_cast<std::uint64_t>(o.seed));
    auto model = ctx.prepare_model(BreedHead(head));
    torch::optim::Adam adam(ctx.parameters(model), torch::optim::AdamOptions(o.lr));
    dtrain::schedule::ReduceLROnPlateau plateau(adam, {.factor = o.lr_factor, .patience = o.lr_patience});
    std::int64_t samples = 0;
    double loop_s = 0;
    for (auto epoch : ctx.epochs(o.epochs)) {
      const auto epoch_start = std::chrono::steady_clock::now();
      model->train();
      double loss_sum = 0;
      std::int64_t batches = 0;
      for (const data::Fields& b : ctx.shard(train, o.batch)) {
        adam.zero_grad();
        const auto loss = torch::nn::functional::cross_entropy(ctx.forward(model, b["embedding"]), b["label"]);
        ctx.backward(loss);
        ctx.step(adam);
        loss_sum += loss.item<double>();
        ++batches;
        samples += b["label"].size(0);
      }
      loop_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch_start).count();
      const double train_loss = ctx.all_reduce(batches ? loss_sum / static_cast<double>(batches) : 0.0, dtrain::reduce::mean);
      model->eval();
      const auto v = dtrain::evaluation::validate(ctx, val, o.batch, [&](const data::Fields& b) {
        return dtrain::evaluation::Scored{ctx.forward(model, b["embedding"]), b["label"]};
      });
      plateau.step(v.loss);
      const double total = ctx.all_reduce(static_cast<double>(samples), dtrain::reduce::sum);
      const double slowest = ctx.all_reduce(loop_s, dtrain::reduce::max);
      ctx.report({{"epoch", epoch}, {"train_loss", train_loss}, {"val_loss", v.loss}, {"val_accuracy", v.accuracy},
                  {"lr", plateau.lrs().front()}, {"train_samples", total}, {"train_samples_per_s", total / slowest},
                  {"loop_s", slowest}},
                 ctx.checkpoint(model, adam).with_object("labels", labels));
    }
  });
  const double train_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  if (!result.best_checkpoint()) throw std::runtime_error("the run saved no checkpoint");
  const auto& best = *result.best_checkpoint();

  // Batch inference of the test split through the same pipeline on N workers, from the best
  // checkpoint alone (the head from its model_config.json, the breeds from its class map).
  const auto predicted = dtrain::evaluation::batch_predict<BreedHead>(
      best.path(), test,
      {.output = fs::path(o.storage) / o.name / "predictions", .format = dtrain::evaluation::PredictionFormat::jsonl,
       .batch = o.batch, .part_size = o.batch * 16, .start = dtrain::Start::fresh},
      {.num_workers = static_cast<int>(o.workers)});
  const auto breeds = static_cast<std::int64_t>(train_folder.classes().size());
  dtrain::evaluation::ConfusionMatrix cm(breeds);
  {
    std::ifstream in(predicted.file);
    std::vector<std::int64_t> predictions, truth;
    for (std::string line; std::getline(in, line);) {
      const auto row = nlohmann::json::parse(line);
      predictions.push_back(row.at("class_index").get<std::int64_t>());
      truth.push_back(test_folder.label(row.at("index").get<std::int64_t>()));
    }
    if (static_cast<std::int64_t>(predictions.size()) != test_folder.size())
      throw std::runtime_error(predicted.file.string() + ": " + std::to_string(predictions.size()) + " predictions for " +
                               std::to_string(test_folder.size()) + " test images");
    cm.update(torch::tensor(predictions), torch::tensor(truth));
  }
  // scikit-learn's multilabel_confusion_matrix: each breed against the rest.
  const auto counts = cm.counts_table();
  const auto per = cm.per_class();
  nlohmann::json per_breed = nlohmann::json::array();
  for (std::size_t k = 0; k < static_cast<std::size_t>(breeds); ++k) {
    std::int64_t tp = counts[k][k], fp = 0, fn = 0;
    for (std::size_t j = 0; j < static_cast<std::size_t>(breeds); ++j)
      if (j != k) fp += counts[j][k], fn += counts[k][j];
    per_breed.push_back({{"breed", train_folder.classes()[k]}, {"tn", cm.total() - tp - fp - fn}, {"fp", fp}, {"fn", fn},
                         {"tp", tp}, {"precision", per.precision[k]}, {"recall", per.recall[k]}, {"f1", per.f1[k]}});
  }
  const auto& b = best.metrics();
  const auto& m = result.metrics;
  nlohmann::json line = {
      {"model", "clip head"}, {"workers", o.workers}, {"batch", o.batch}, {"epochs", o.epochs}, {"breeds", breeds},
      {"train_images", train_folder.size()}, {"val_images", val_folder.size()}, {"test_images", test_folder.size()},
      {"embedding_dim", head.embedding_dim}, {"train_samples_per_s", m.at("train_samples_per_s").number()},
      {"loop_s", m.at("loop_s").number()}, {"train_s", train_s}, {"final_train_loss", m.at("train_loss").number()},
      {"best_epoch", static_cast<std::int64_t>(b.at("epoch").number())}, {"val_loss", b.at("val_loss").number()},
      {"val_accuracy", b.at("val_accuracy").number()}, {"test_accuracy", cm.accuracy()},
      {"test_f1_macro", cm.summary().at("f1_macro")}, {"predictions", predicted.file.string()},
      {"best_checkpoint", best.path().string()}, {"per_breed", per_breed}};
  line["wall_s"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - program_start).count();
  std::cout << line.dump() << std::endl;
  return 0;
} catch (const std::exception& e) {
  std::cerr << "dog_breeds: " << e.what() << std::endl;
  return 1;
}
