// SPDX-License-Identifier: Apache-2.0
// Image-folder classification, the same work as the Python peer benchmarks/peers/images.py: ROOT/train and
// ROOT/test read as torchvision's ImageFolder reads them (data::ImageFolder: files decoded on the
// loader threads as PIL decodes them), RandomHorizontalFlip(0.5) drawn from the pipeline's
// checkpointed generator, ToTensor + Normalize, torchvision's ResNet-18 (dtrain::nn::ResNet,
// nn/resnet.hpp) with the small-image stem (conv1 3x3 stride 1, no max-pool), --channels input
// channels and layer1 --width channels wide (64 is torchvision's), SGD(lr 0.05, momentum 0.9,
// weight decay 5e-4) with a cosine schedule over the epochs,
// global batch 128 over the workers; the test folder evaluated on every worker; one JSON line with
// the peer's keys. --decode-only times the input pipeline alone (decode_samples_per_s).
//
//   image_classifier --root DIR [--workers N] [--threads-per-worker N] [--loader-threads N]
//       [--global-batch N] [--epochs N] [--max-steps N] [--width N] [--channels 1|3] [--mean X]
//       [--std X] [--seed N] [--decode-only] [--precision fp32|bf16] [--storage-path DIR] [--name NAME]
//       [--weights FILE] [--strategy ddp|fsdp] [--predictions DIR]
//
// --strategy fsdp shards the model with strategy::fsdp<> (wrap::top_level: conv1, bn1, each
// residual stage layer1..layer4 and fc are its units); model_state_bytes in the JSON line is what
// rank 0 holds of parameters, gradients and optimizer state.
// --weights starts from torchvision weights: the state_dict of torchvision.models.resnet18 with the
// small-image stem (torch.save or .safetensors; examples/torchvision_resnet18.py makes one), loaded
// by name with nn::load_pretrained: strictly, except that a file whose fc has another number of
// classes, or none, leaves the new fc for the folder's classes (reported missing). Any other
// missing or unexpected name or shape is an error naming the file and the keys; --width must be 64
// and --channels the file's. Without --weights the network starts from torchvision's initialisation.
// --loader-workers N is read as --loader-threads N (the peer's name for its DataLoader processes).
// Each checkpoint carries what serving needs: the model's Config (ResNet describes itself), the
// evaluation transforms (data::ImageTransforms) and the class names. After training, the best
// checkpoint alone serves raw image files (Predictor + evaluation::ImageInputs: no sizes, no
// transforms written here); --predictions DIR scores every test file by batch inference on 2
// workers (evaluation::batch_predict), writing DIR/predictions.csv.

#include <dtrain/data/image_folder.hpp>
#include <dtrain/data/image_transforms.hpp>
#include <dtrain/evaluation/batch_predict.hpp>
#include <dtrain/evaluation/image_inputs.hpp>
#include <dtrain/data/pipeline.hpp>
#include <dtrain/dtrain.hpp>
#include <dtrain/data.hpp>
#include <dtrain/models.hpp>
#include <dtrain/inference.hpp>
#include <dtrain/evaluation/validation.hpp>
#include <dtrain/nn/resnet.hpp>
#include <dtrain/schedule/warmup_cosine.hpp>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <string>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

namespace data = dtrain::data;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

struct Options {
  std::string root, precision = "fp32", strategy = "ddp", storage = "image_runs", name = "image_classifier",
      weights, predictions;
  int workers = 2, threads = 1, loader_threads = 2, channels = 1;
  std::int64_t global_batch = 128, epochs = 1, max_steps = 0, width = 16, seed = 0;
  float mean = 0.2860f, std = 0.3530f;
  bool decode_only = false;
};

constexpr const char* usage =
    "usage: image_classifier --root DIR [--workers N] [--threads-per-worker N] [--loader-threads N]\n"
    "                        [--global-batch N] [--epochs N] [--max-steps N] [--width N] [--channels 1|3]\n"
    "                        [--mean X] [--std X] [--seed N] [--decode-only] [--precision fp32|bf16]\n"
    "                        [--storage-path DIR] [--name NAME] [--weights FILE]\n"
    "                        [--strategy ddp|fsdp] [--predictions DIR]\n";

[[noreturn]] void usage_error(const std::string& why) {
  std::cerr << "image_classifier: " << why << "\n" << usage;
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      std::cout << usage;
      std::exit(0);
    }
    if (flag == "--decode-only") {
      o.decode_only = true;
      continue;
    }
    if (flag.rfind("--", 0) != 0) usage_error("unexpected argument '" + flag + "'");
    if (i + 1 >= argc) usage_error(flag + " needs a value");
    const std::string value = argv[++i];
    auto integer = [&](long long min, long long max) {
      try {
        std::size_t used = 0;
        const long long v = std::stoll(value, &used);
        if (used != value.size() || v < min || v > max) throw std::invalid_argument(value);
        return v;
      } catch (const std::exception&) {
        usage_error(flag + " needs an integer from " + std::to_string(min) + " to " + std::to_string(max) +
                    ", got '" + value + "'");
      }
    };
    auto real = [&] {
      try {
        std::size_t used = 0;
        const float v = std::stof(value, &used);
        if (used != value.size()) throw std::invalid_argument(value);
        return v;
      } catch (const std::exception&) {
        usage_error(flag + " needs a number, got '" + value + "'");
      }
    };
    constexpr long long int_max = std::numeric_limits<int>::max();
    if (flag == "--root") o.root = value;
    else if (flag == "--workers") o.workers = static_cast<int>(integer(1, 4096));
    else if (flag == "--threads-per-worker") o.threads = static_cast<int>(integer(1, 4096));
    else if (flag == "--loader-threads" || flag == "--loader-workers") o.loader_threads = static_cast<int>(integer(0, 256));
    else if (flag == "--global-batch") o.global_batch = integer(1, int_max);
    else if (flag == "--epochs") o.epochs = integer(1, int_max);
    else if (flag == "--max-steps") o.max_steps = integer(0, std::numeric_limits<std::int64_t>::max());
    else if (flag == "--width") o.width = integer(1, 4096);
    else if (flag == "--channels") o.channels = static_cast<int>(integer(1, 3));
    else if (flag == "--mean") o.mean = real();
    else if (flag == "--std") o.std = real();
    else if (flag == "--seed") o.seed = integer(0, std::numeric_limits<std::int64_t>::max());
    else if (flag == "--precision") o.precision = value;
    else if (flag == "--storage-path") o.storage = value;
    else if (flag == "--name") o.name = value;
    else if (flag == "--weights") o.weights = value;
    else if (flag == "--strategy") o.strategy = value;
    else if (flag == "--predictions") o.predictions = value;
    else usage_error("unknown flag " + flag);
  }
  if (o.root.empty()) usage_error("--root DIR is required (DIR/train/<class>/* and DIR/test/<class>/*)");
  if (o.channels == 2) usage_error("--channels must be 1 or 3, got 2");
  if (o.precision != "fp32" && o.precision != "bf16") usage_error("--precision must be fp32 or bf16, got '" + o.precision + "'");
  if (o.strategy != "ddp" && o.strategy != "fsdp") usage_error("--strategy must be ddp or fsdp, got '" + o.strategy + "'");
  if (!(o.std > 0)) usage_error("--std must be positive");
  if (o.global_batch % o.workers)
    usage_error("--global-batch " + std::to_string(o.global_batch) + " must be divisible by --workers " +
                std::to_string(o.workers));
  if (!o.weights.empty() && !std::filesystem::is_regular_file(o.weights))
    usage_error("--weights " + o.weights + ": no such file (examples/torchvision_resnet18.py makes one)");
  if (o.decode_only && o.max_steps == 0) o.max_steps = 100;  // the peer's default
  return o;
}

// The peer's pipelines: train flips, test does not; both ToTensor + Normalize per channel. The test
// split's preprocessing is data (ImageTransforms), saved with every checkpoint for serving.
data::ImageTransforms eval_transforms(const Options& o) { return data::ImageTransforms(o.channels).normalize({o.mean}, {o.std}); }
auto train_split(const Options& o) {
  return data::pipelined(data::ImageFolder(o.root + "/train", {.channels = o.channels}),
                         data::map(data::random_horizontal_flip{0.5}) |
                             data::collate(data::stack_images{{o.mean}, {o.std}}),
                         {.loader_threads = o.loader_threads, .seed = static_cast<std::uint64_t>(o.seed)});
}
auto test_split(const Options& o) {
  const auto eval = eval_transforms(o);
  return data::pipelined(data::ImageFolder(o.root + "/test", {.channels = o.channels}),
                         data::map(eval) | data::collate(eval.to_tensor()), {.loader_threads = o.loader_threads});
}
using TrainSplit = decltype(train_split(Options{}));

template <class Precision, class Strategy>
nlohmann::json run(const Options& o, double started) {
  const auto train = train_split(o);
  const auto test = test_split(o);
  const auto classes = static_cast<std::int64_t>(train.source().classes().size());
  const auto labels = data::LabelEncoder::fit(train.source().classes());  // sorted, as the folder's classes
  if (test.source().classes() != train.source().classes())
    throw dtrain::DataError(o.root + "/test has other class directories than " + o.root + "/train");

  using Trainer = dtrain::Trainer<dtrain::nn::ResNet, TrainSplit, dtrain::checkpointer::directory<>, Precision, Strategy>;
  dtrain::RunConfig run{.storage_path = o.storage, .name = o.name};
  run.checkpoint = {.num_to_keep = 1};
  run.start = dtrain::Start::fresh;
  Trainer trainer({.num_workers = o.workers}, run);
  auto result = trainer.fit([&](typename Trainer::context& ctx) {
    torch::set_num_threads(o.threads);
    if (o.decode_only) {  // the input pipeline alone: this rank's batches, no model
      (void)ctx.all_reduce(0.0);
      const double t0 = now_s();
      std::int64_t n = 0, batches = 0;
      for (const auto& b : ctx.shard(train, o.global_batch)) {
        n += b.size();
        if (++batches >= o.max_steps) break;
      }
      const double total = ctx.all_reduce(static_cast<double>(n), dtrain::reduce::sum);
      const double loop_s = now_s() - t0;
      ctx.report({{"samples", total}, {"decode_loop_s", loop_s}, {"decode_samples_per_s", total / loop_s}});
      return;
    }
    torch::manual_seed(static_cast<std::uint64_t>(o.seed));
    auto config = dtrain::nn::ResNetConfig::basic({2, 2, 2, 2}, classes);  // resnet18
    config.stem = "small";
    config.in_channels = o.channels;
    config.width = o.width;
    dtrain::nn::ResNet net(config);
    dtrain::weights::LoadReport loaded;
    if (!o.weights.empty()) {
      try {
        loaded = dtrain::nn::load_pretrained(net, o.weights);
      } catch (const std::exception& e) {
        throw dtrain::ConfigError(std::string("--weights: ") + e.what() +
                                  " (it takes torchvision's resnet18 with the small-image stem, as "
                                  "examples/torchvision_resnet18.py makes it, with --width 64 and the file's --channels)");
      }
      std::string fresh;  // fc, when the file's head has other classes or there is none
      for (const auto& key : loaded.missing) fresh += (fresh.empty() ? "; not in the file, initialised: " : ", ") + key;
      if (ctx.world_rank() == 0)
        std::cerr << "image_classifier: " << loaded.loaded << " tensors loaded from " << o.weights << fresh << "\n";
    }
    auto model = ctx.prepare_model(net);
    torch::optim::SGD opt(ctx.parameters(model), torch::optim::SGDOptions(0.05).momentum(0.9).weight_decay(5e-4));
    // CosineAnnealingLR(T_max = epochs), stepped once per epoch.
    dtrain::schedule::WarmupCosine cosine(opt, {.warmup_steps = 0, .total_steps = o.epochs});
    std::int64_t steps = 0, samples = 0;
    double first_step = 0, last_loss = 0, loop_s = 0;
    for (auto epoch : ctx.epochs(o.epochs)) {
      model->train();
      (void)ctx.all_reduce(0.0);  // a barrier: the loop's time starts together
      const double e0 = now_s();
      for (const auto& b : ctx.shard(train, o.global_batch)) {
        opt.zero_grad();
        torch::Tensor loss;
        {
          auto autocast = ctx.autocast();
          loss = torch::nn::functional::cross_entropy(ctx.forward(model, b["image"]).to(torch::kFloat32), b["label"]);
        }
        ctx.backward(loss);
        ctx.step(opt);
        if (!first_step) first_step = now_s();
        samples += b.size();
        last_loss = loss.item<double>();
        if (o.max_steps && ++steps >= o.max_steps) break;
      }
      (void)ctx.all_reduce(0.0);
      loop_s += now_s() - e0;
      cosine.step();
      if (o.max_steps && steps >= o.max_steps) ctx.end_epoch();
      model->eval();
      const auto v = dtrain::evaluation::validate(ctx, test, 256 * ctx.world_size(), [&](const data::Fields& b) {
        auto autocast = ctx.autocast();
        return dtrain::evaluation::Scored{ctx.forward(model, b["image"]).to(torch::kFloat32), b["label"]};
      });
      const double total = ctx.all_reduce(static_cast<double>(samples), dtrain::reduce::sum);
      ctx.report({{"epoch", epoch}, {"steps", ctx.steps()}, {"test_loss", v.loss}, {"test_accuracy", v.accuracy},
                  {"final_train_loss", last_loss}, {"train_samples", total}, {"train_loop_s", loop_s},
                  {"train_samples_per_s", total / loop_s}, {"startup_s", first_step - started},
                  {"weights_loaded", static_cast<std::int64_t>(loaded.loaded)},
                  {"weights_missing", static_cast<std::int64_t>(loaded.missing.size())},
                  {"model_state_bytes", ctx.model_state_bytes(model, opt)}},
                 ctx.checkpoint(model, opt)
                     .with_object("pipeline", train.random_state())
                     .with_object(dtrain::schedule::checkpoint_name, cosine)
                     .with_object("transforms", eval_transforms(o))
                     .with_object("labels", labels));
      if (o.max_steps && steps >= o.max_steps) break;
    }
  });
  const auto& m = result.metrics;
  nlohmann::json line = {{"workers", o.workers}, {"loader_threads", o.loader_threads},
                         {"threads_per_worker", o.threads}, {"global_batch", o.global_batch},
                         {"channels", o.channels}, {"precision", o.precision}, {"torch", TORCH_VERSION}};
  if (o.decode_only) {
    line.update({{"mode", "decode-only"}, {"samples", static_cast<std::int64_t>(m.at("samples").number())},
                 {"decode_samples_per_s", m.at("decode_samples_per_s").number()}});
    return line;
  }
  line.update({{"model", "resnet18"}, {"width", o.width}, {"strategy", o.strategy},
               {"model_state_bytes", static_cast<std::int64_t>(m.at("model_state_bytes").number())}, {"epochs", o.epochs},
               {"steps", static_cast<std::int64_t>(m.at("steps").number())},
               {"train_samples", static_cast<std::int64_t>(m.at("train_samples").number())},
               {"train_loop_s", m.at("train_loop_s").number()}, {"train_samples_per_s", m.at("train_samples_per_s").number()},
               {"startup_s", m.at("startup_s").number()}, {"final_train_loss", m.at("final_train_loss").number()},
               {"test_loss", m.at("test_loss").number()}, {"test_accuracy", m.at("test_accuracy").number()},
               {"classes", static_cast<std::int64_t>(train.source().classes().size())},
               {"train_images", train.size()}, {"test_images", test.size()}});
  if (!o.weights.empty())
    line.update({{"weights", o.weights}, {"weights_loaded", static_cast<std::int64_t>(m.at("weights_loaded").number())},
                 {"weights_missing", static_cast<std::int64_t>(m.at("weights_missing").number())}});
  if (!result.best_checkpoint()) return line;
  const auto best = result.best_checkpoint()->path();
  line["checkpoint"] = best.string();
  // Serving from the checkpoint alone: the model, its transforms and class names are in it.
  std::vector<std::string> files;
  for (std::int64_t i = 0; i < test.size(); ++i) files.push_back(test.source().path(i));
  auto predictor = dtrain::evaluation::Predictor<dtrain::nn::ResNet>::from_checkpoint(best, dtrain::evaluation::ImageInputs{});
  const auto served = predictor.predict(std::vector<std::string>(files.begin(), files.begin() + std::min<std::int64_t>(3, test.size())));
  for (std::int64_t i = 0; i < served.size(); ++i)
    std::cerr << "serve " << files[static_cast<std::size_t>(i)] << ": " << served[i].label << " (p="
              << served[i].probabilities[static_cast<std::size_t>(served[i].class_index)] << ")\n";
  if (!o.predictions.empty()) {  // every test file, by batch inference on 2 workers
    dtrain::RunConfig scoring{.storage_path = o.storage, .name = o.name + "_predictions"};
    const auto out = dtrain::evaluation::batch_predict<dtrain::nn::ResNet>(
        best, files, dtrain::evaluation::ImageInputs{}, {.output = o.predictions, .start = dtrain::Start::fresh},
        {.num_workers = 2}, scoring);
    line["predictions"] = out.file.string();
    line["predictions_samples"] = out.samples;
    // The file's labels (CSV: index,label,...) against the folder's classes of the files.
    std::ifstream csv(out.file);
    std::string row;
    std::getline(csv, row);  // the header
    std::int64_t right = 0, n = 0;
    for (; std::getline(csv, row) && n < test.size(); ++n) {
      const auto first = row.find(',');
      const auto label = row.substr(first + 1, row.find(',', first + 1) - first - 1);
      right += label == train.source().classes()[static_cast<std::size_t>(test.source().label(n))];
    }
    line["predictions_accuracy"] = n ? static_cast<double>(right) / static_cast<double>(n) : 0.0;
  }
  return line;
}

}  // namespace

int main(int argc, char** argv) try {
  const double script_start = now_s();
  // Workers are copies of this program started by the driver: they take the driver's start time.
  if (!std::getenv("IMAGE_CLASSIFIER_START")) setenv("IMAGE_CLASSIFIER_START", std::to_string(script_start).c_str(), 1);
  const double started = std::stod(std::getenv("IMAGE_CLASSIFIER_START"));
  const auto o = parse(argc, argv);
  using bf16 = dtrain::precision::amp<dtrain::precision::bf16>;
  using fp32 = dtrain::precision::fp32;
  using ddp = dtrain::strategy::ddp<>;
  using fsdp = dtrain::strategy::fsdp<>;  // wrap::top_level: each residual stage is a unit
  const bool half = o.precision == "bf16", sharded = o.strategy == "fsdp";
  auto line = sharded ? (half ? run<bf16, fsdp>(o, started) : run<fp32, fsdp>(o, started))
                      : (half ? run<bf16, ddp>(o, started) : run<fp32, ddp>(o, started));
  line["wall_s"] = now_s() - started;
  std::cout << line.dump() << std::endl;
  return 0;
} catch (const std::exception& e) {
  std::cerr << "image_classifier: " << e.what() << std::endl;
  return 1;
}
