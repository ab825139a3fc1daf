// SPDX-License-Identifier: Apache-2.0
// A ViT fine-tuned on an image folder (scripts/make-image-folder) with an evaluation every N steps,
// as the Hugging Face ViT tutorial's Trainer does (eval_strategy "steps", load_best_model_at_end),
// the same work as benchmarks/vit_peer.py: ROOT/train's images through the model's
// ViTImageProcessor (preprocessor_config.json: PIL's bilinear resize, rescale, normalize), split
// stratified by class into training and validation (--val-fraction, seeded: Python's
// random.Random shuffle, so the peer's split is the same); nn::ViTForImageClassification with the
// directory's backbone and a new head for the folder's classes; AdamW with a linear warm-up from
// lr / 10 then cosine decay to 0 (schedule::WarmupCosine) on 2 workers (ddp<>); every --eval-every
// steps (and at the last) the validation loss and accuracy, reported with a checkpoint that holds
// the processor and the class names; the best checkpoint by val_loss alone scores ROOT/test's image
// files (evaluation::Predictor with ImageInputs) and, with --export DIR, is written as a Hugging
// Face directory that transformers' ViTForImageClassification.from_pretrained loads. One JSON line.
//
//   finetune_vit --model-dir DIR --data ROOT [--workers N] [--threads-per-worker N]
//       [--global-batch N] [--epochs N] [--max-steps N] [--eval-every N] [--val-fraction X]
//       [--lr X] [--weight-decay X] [--warmup X] [--seed N] [--storage-path DIR] [--name NAME]
//       [--export DIR]
//
// --model-dir: a ViTForImageClassification directory (config.json, model.safetensors,
// preprocessor_config.json); examples/make_vit.py makes one with random weights. --max-steps N
// trains N steps whatever --epochs says (the Trainer's max_steps). --warmup: the fraction of the
// steps that warm up. probe_logits in the JSON line are the best checkpoint's logits for
// probe_files (4 test images), which examples/check_vit_export.py compares with transformers'.

#include <dtrain/data/image_folder.hpp>  // needs OpenCV: link dtrain::images
#include <dtrain/data/splits.hpp>
#include <dtrain/data/vit_image_processor.hpp>
#include <dtrain/dtrain.hpp>
#include <dtrain/data.hpp>
#include <dtrain/models.hpp>
#include <dtrain/inference.hpp>
#include <dtrain/tune.hpp>
#include <dtrain/evaluation/image_inputs.hpp>  // the Predictor on image files: dtrain::images too
#include <dtrain/evaluation/validation.hpp>
#include <dtrain/memory.hpp>
#include <dtrain/nn/vit.hpp>
#include <dtrain/schedule/warmup_cosine.hpp>

#include "finetune.hpp"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

namespace data = dtrain::data;
namespace fs = std::filesystem;
using finetune::now_s;

namespace {

constexpr const char* kUsage =
    "usage: finetune_vit --model-dir DIR --data ROOT [--workers N] [--threads-per-worker N] [--global-batch N]\n"
    "       [--epochs N] [--max-steps N] [--eval-every N] [--val-fraction X] [--lr X] [--weight-decay X]\n"
    "       [--warmup X] [--seed N] [--storage-path DIR] [--name NAME] [--export DIR]\n";

struct Options {
  fs::path model_dir, data_dir, export_dir;
  std::string storage = "vit_runs", name = "finetune_vit";
  std::int64_t workers = 2, threads = 1, global_batch = 32, epochs = 1, max_steps = 0, eval_every = 50, seed = 0;
  double val_fraction = 0.1, lr = 2e-4, weight_decay = 0.01, warmup = 0.1;
};

std::int64_t integer(const std::string& flag, const std::string& v, std::int64_t low) {
  std::size_t end = 0;
  std::int64_t n = 0;
  try {
    n = std::stoll(v, &end);
  } catch (const std::exception&) {
    end = 0;
  }
  if (end != v.size() || v.empty() || n < low)
    throw std::invalid_argument(flag + " needs an integer >= " + std::to_string(low) + ", got '" + v + "'");
  return n;
}

double real(const std::string& flag, const std::string& v, double low, double below) {
  std::size_t end = 0;
  double x = 0;
  try {
    x = std::stod(v, &end);
  } catch (const std::exception&) {
    end = 0;
  }
  if (end != v.size() || v.empty() || !(x >= low && x < below))
    throw std::invalid_argument(flag + " needs a number in [" + std::to_string(low) + ", " + std::to_string(below) +
                                "), got '" + v + "'");
  return x;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; i += 2) {
    const std::string f = argv[i];
    if (i + 1 >= argc) throw std::invalid_argument(f + " needs a value");
    const std::string v = argv[i + 1];
    if (f == "--model-dir") o.model_dir = v;
    else if (f == "--data") o.data_dir = v;
    else if (f == "--workers") o.workers = integer(f, v, 1);
    else if (f == "--threads-per-worker") o.threads = integer(f, v, 1);
    else if (f == "--global-batch") o.global_batch = integer(f, v, 1);
    else if (f == "--epochs") o.epochs = integer(f, v, 1);
    else if (f == "--max-steps") o.max_steps = integer(f, v, 0);
    else if (f == "--eval-every") o.eval_every = integer(f, v, 1);
    else if (f == "--seed") o.seed = integer(f, v, 0);
    else if (f == "--val-fraction") o.val_fraction = real(f, v, 0.01, 1);
    else if (f == "--lr") o.lr = real(f, v, 1e-12, 1e3);
    else if (f == "--weight-decay") o.weight_decay = real(f, v, 0, 1e3);
    else if (f == "--warmup") o.warmup = real(f, v, 0, 1);
    else if (f == "--storage-path") o.storage = v;
    else if (f == "--name") o.name = v;
    else if (f == "--export") o.export_dir = v;
    else throw std::invalid_argument("unknown flag " + f);
  }
  if (o.model_dir.empty() || o.data_dir.empty()) throw std::invalid_argument("--model-dir and --data are required");
  if (o.workers > 4096) throw std::invalid_argument("--workers needs an integer from 1 to 4096");
  if (o.global_batch % o.workers) throw std::invalid_argument("--global-batch must be a multiple of --workers");
  return o;
}

// A ViTForImageClassification directory, checked before anything is read from it.
void check_model_dir(const fs::path& dir) {
  if (!fs::is_directory(dir))
    throw dtrain::ConfigError("--model-dir " + dir.string() + ": not a directory; a ViTForImageClassification "
                              "directory holds config.json, model.safetensors and preprocessor_config.json "
                              "(examples/make_vit.py makes one)");
  for (const char* file : {"config.json", "model.safetensors", "preprocessor_config.json"})
    if (!fs::exists(dir / file))
      throw dtrain::ConfigError((dir / file).string() + ": not found; a ViTForImageClassification directory holds "
                                "config.json, model.safetensors and preprocessor_config.json");
}

// Every image of `folder` through the processor, decoded up front: pixel_values [N, C, H, W], labels.
data::TensorDataset processed(const data::ViTImageProcessor& processor, const data::ImageFolder& folder) {
  std::vector<std::string> files;
  std::vector<std::int64_t> labels;
  for (std::int64_t i = 0; i < folder.size(); ++i) files.push_back(folder.path(i)), labels.push_back(folder.label(i));
  return {processor.load(files), torch::tensor(labels)};
}

}  // namespace

int main(int argc, char** argv) try {
  dtrain::retain_freed_memory();
  const double script_start = now_s();
  if (!std::getenv("FINETUNE_VIT_START")) setenv("FINETUNE_VIT_START", std::to_string(script_start).c_str(), 1);
  const double started = std::stod(std::getenv("FINETUNE_VIT_START"));  // the driver's start, on every worker
  Options o;
  try {
    o = parse(argc, argv);
  } catch (const std::invalid_argument& e) {
    std::cerr << "finetune_vit: " << e.what() << "\n" << kUsage;
    return 2;
  }
  torch::set_num_threads(static_cast<int>(o.threads));
  check_model_dir(o.model_dir);

  // The data (every worker reads it, as the peer's driver does once): ROOT/train split into
  // training and validation by class, ROOT/test for the best checkpoint.
  const double t0 = now_s();
  for (const char* part : {"train", "test"})
    if (!fs::is_directory(o.data_dir / part))
      throw dtrain::DataError((o.data_dir / part).string() + ": not a directory; --data is an image folder's root, "
                              "ROOT/train/<class>/<images> and ROOT/test/<class>/<images> (scripts/make-image-folder)");
  const auto processor = data::ViTImageProcessor::from_pretrained(o.model_dir);
  const data::ImageFolder train_folder(o.data_dir / "train", {.channels = processor.channels});
  const data::ImageFolder test_folder(o.data_dir / "test", {.channels = processor.channels});
  if (test_folder.classes() != train_folder.classes())
    throw dtrain::DataError((o.data_dir / "test").string() + ": its classes are not those of " +
                            (o.data_dir / "train").string());
  const auto all = processed(processor, train_folder);
  std::vector<std::string> classes_of_rows;
  for (std::int64_t i = 0; i < train_folder.size(); ++i)
    classes_of_rows.push_back(train_folder.classes()[static_cast<std::size_t>(train_folder.label(i))]);
  const auto split = data::stratified_split(classes_of_rows, o.val_fraction, 0.0, static_cast<std::uint64_t>(o.seed));
  if (split.validation.empty() || split.train.size() < static_cast<std::size_t>(o.workers))
    throw dtrain::ConfigError("--val-fraction " + std::to_string(o.val_fraction) + " of " +
                              std::to_string(train_folder.size()) + " images leaves " +
                              std::to_string(split.train.size()) + " to train and " +
                              std::to_string(split.validation.size()) + " to validate; both need some");
  using Split = data::Subset<data::TensorDataset>;
  const Split train(all, split.train), val(all, split.validation);
  const auto labels = data::LabelEncoder::fit(train_folder.classes());  // sorted, as the folder's classes
  const double pipeline_s = now_s() - t0;

  auto config = dtrain::nn::ViTConfig::from_pretrained(o.model_dir);
  config.id2label = train_folder.classes();  // a new head, one output per class, named as the folders
  const auto per_epoch = finetune::steps_per_epoch(train.size(), o.workers, o.global_batch);
  const auto total_steps = o.max_steps ? o.max_steps : per_epoch * o.epochs;
  const auto epochs = (total_steps + per_epoch - 1) / per_epoch;
  const auto warmup_steps = static_cast<std::int64_t>(o.warmup * static_cast<double>(total_steps));

  using ViT = dtrain::nn::ViTForImageClassification;
  using Trainer = dtrain::Trainer<ViT, Split, dtrain::checkpointer::directory<>>;
  dtrain::RunConfig run{.storage_path = o.storage, .name = o.name};
  run.checkpoint = {.num_to_keep = 1, .score_attribute = "val_loss", .score_order = dtrain::ScoreOrder::min};
  run.start = dtrain::Start::fresh;
  Trainer trainer({.num_workers = static_cast<int>(o.workers)}, run);
  auto result = trainer.fit([&](Trainer::context& ctx) {
    torch::manual_seed(static_cast<std::uint64_t>(o.seed));
    ViT vit(config);
    const auto loaded = dtrain::nn::load_pretrained(*vit->vit, o.model_dir);  // the backbone; the head is new
    auto model = ctx.prepare_model(vit);
    torch::optim::AdamW opt(ctx.parameters(model), torch::optim::AdamWOptions(o.lr).weight_decay(o.weight_decay));
    dtrain::schedule::WarmupCosine schedule(
        opt, {.warmup_steps = warmup_steps, .total_steps = total_steps, .start_factor = 0.1, .min_lr = 0});
    ctx.set_total_steps(total_steps);
    std::int64_t steps = 0, samples = 0, evals = 0;
    double first_step = 0, last_loss = 0, train_s = 0, eval_s = 0;
    double segment = (ctx.all_reduce(0.0), now_s());  // a barrier: the clocks start together
    // The Trainer's eval_steps: validation over the ranks, reported with a checkpoint. Its time
    // (barrier to barrier, the checkpoint's hand-off included) is not training time.
    const auto evaluate = [&] {
      (void)ctx.all_reduce(0.0);
      const double e0 = now_s();
      train_s += e0 - segment;
      model->eval();
      const auto v = dtrain::evaluation::validate(ctx, val, 64 * ctx.world_size(), [&](const data::Batch& b) {
        return dtrain::evaluation::Scored{ctx.forward(model, b.data), b.target};
      });
      model->train();
      const double total = ctx.all_reduce(static_cast<double>(samples), dtrain::reduce::sum);
      ++evals;
      ctx.report({{"step", steps}, {"val_loss", v.loss}, {"val_accuracy", v.accuracy}, {"train_loss", last_loss},
                  {"lr", schedule.lrs().front()}, {"train_samples", total}, {"train_s", train_s},
                  {"train_samples_per_s", total / train_s}, {"eval_s", eval_s + now_s() - e0}, {"evals", evals},
                  {"startup_s", first_step - started}, {"init_loaded", static_cast<double>(loaded.loaded)},
                  {"init_unexpected", static_cast<double>(loaded.unexpected.size())}},
                 ctx.checkpoint(model, opt).with_object("transforms", processor).with_object("labels", labels));
      (void)ctx.all_reduce(0.0);
      segment = now_s();
      eval_s += segment - e0;
    };
    model->train();
    for ([[maybe_unused]] auto epoch : ctx.epochs(epochs)) {
      for (const auto& b : ctx.shard(train, o.global_batch)) {
        opt.zero_grad();
        const auto loss = torch::nn::functional::cross_entropy(ctx.forward(model, b.data), b.target);
        ctx.backward(loss);
        ctx.step(opt);
        schedule.step();
        if (!first_step) first_step = now_s();
        samples += b.target.size(0);
        last_loss = loss.item<double>();
        if (++steps % o.eval_every == 0 || steps == total_steps) evaluate();
        if (steps >= total_steps) break;
      }
      if (steps >= total_steps) {
        ctx.end_epoch();
        break;
      }
    }
  });
  if (!result.best_checkpoint()) throw std::runtime_error("the run saved no checkpoint");

  // The best checkpoint by val_loss (load_best_model_at_end) alone serves ROOT/test's image files:
  // the model from its config, the processor and class names it saved.
  const auto& best = *result.best_checkpoint();
  auto predictor =
      dtrain::evaluation::Predictor<ViT>::from_checkpoint(best.path(), dtrain::evaluation::ImageInputs{});
  const double h0 = now_s();
  std::vector<std::string> test_files;
  std::int64_t correct = 0;
  for (std::int64_t begin = 0; begin < test_folder.size(); begin += 256) {
    const auto end = std::min(test_folder.size(), begin + 256);
    std::vector<std::string> files;
    std::vector<std::int64_t> targets;
    for (auto i = begin; i < end; ++i) {
      files.push_back(test_folder.path(i));
      targets.push_back(test_folder.label(i));
    }
    correct += predictor.predict(files).classes().eq(torch::tensor(targets)).sum().item<std::int64_t>();
  }
  const double test_s = now_s() - h0;
  auto& tuned = predictor.model();
  torch::NoGradGuard no_grad;
  nlohmann::json probe_files = nlohmann::json::array(), probe_logits = nlohmann::json::array();
  for (std::int64_t k = 0; k < 4; ++k) {
    const auto path = test_folder.path(k * test_folder.size() / 4);
    probe_files.push_back(path);
    const auto logits = tuned->forward(processor.load({path}))[0].to(torch::kFloat64).contiguous();
    probe_logits.push_back(std::vector<double>(logits.data_ptr<double>(), logits.data_ptr<double>() + logits.numel()));
  }

  const auto& m = result.metrics;
  const auto& b = best.metrics();
  nlohmann::json line = {
      {"model", "vit"}, {"workers", o.workers}, {"threads_per_worker", o.threads}, {"global_batch", o.global_batch},
      {"steps", static_cast<std::int64_t>(m.at("step").number())}, {"total_steps", total_steps},
      {"warmup_steps", warmup_steps}, {"eval_every", o.eval_every},
      {"evals", static_cast<std::int64_t>(m.at("evals").number())},
      {"train_samples", static_cast<std::int64_t>(m.at("train_samples").number())},
      {"train_s", m.at("train_s").number()}, {"eval_s", m.at("eval_s").number()},
      {"train_samples_per_s", m.at("train_samples_per_s").number()}, {"startup_s", m.at("startup_s").number()},
      {"pipeline_s", pipeline_s}, {"final_train_loss", m.at("train_loss").number()},
      {"final_val_loss", m.at("val_loss").number()}, {"final_val_accuracy", m.at("val_accuracy").number()},
      {"best_step", static_cast<std::int64_t>(b.at("step").number())}, {"val_loss", b.at("val_loss").number()},
      {"val_accuracy", b.at("val_accuracy").number()},
      {"test_accuracy", static_cast<double>(correct) / static_cast<double>(std::max<std::int64_t>(1, test_folder.size()))},
      {"test_s", test_s}, {"classes", train_folder.classes().size()}, {"train_images", train.size()},
      {"val_images", val.size()}, {"test_images", test_folder.size()}, {"split_fnv1a", finetune::fnv1a(split.train)},
      {"image_size", processor.height}, {"init_loaded", static_cast<std::int64_t>(m.at("init_loaded").number())},
      {"init_unexpected", static_cast<std::int64_t>(m.at("init_unexpected").number())}, {"lr", o.lr},
      {"weight_decay", o.weight_decay}, {"probe_files", probe_files}, {"probe_logits", probe_logits},
      {"best_checkpoint", best.path().string()}};
  if (!o.export_dir.empty()) {  // back to Python: a Hugging Face directory with its image processor
    dtrain::nn::save_pretrained(*tuned, o.export_dir, {.files = {o.model_dir / "preprocessor_config.json"}});
    line["export"] = o.export_dir.string();
  }
  line["wall_s"] = now_s() - script_start;
  std::cout << line.dump() << std::endl;
  return 0;
} catch (const std::exception& e) {
  std::cerr << "finetune_vit: " << e.what() << std::endl;
  return 1;
}
