// SPDX-License-Identifier: Apache-2.0
#pragma once
// Batch prediction from a checkpoint: a model loaded from a checkpoint directory (a path, or the
// best of a run by score) that gives, per sample, the predicted class name and the probability of
// every class; over a dataset in one process, or split over a worker group's ranks and gathered
// back in the dataset's order.

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/types.h>

#include <dtrain/checkpointer/checkpoint.hpp>
#include <dtrain/checkpointer/model_config.hpp>
#include <dtrain/checkpointer/directory.hpp>
#include <dtrain/config.hpp>
#include <dtrain/data/collate.hpp>
#include <dtrain/data/dataset.hpp>
#include <dtrain/data/fields.hpp>
#include <dtrain/data/preprocess.hpp>
#include <dtrain/error.hpp>
#include <dtrain/evaluation/classification.hpp>
#include <dtrain/evaluation/raw_inputs.hpp>
#include <dtrain/evaluation/text_inputs.hpp>
#include <dtrain/nn/generate.hpp>
#include <dtrain/sampler/sequential.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace evaluation {

/// One sample's prediction.
struct Prediction {
  std::int64_t class_index = 0;
  /// The predicted class's name.
  std::string label;
  /// The probability of every class (softmax of the model's scores), by class index.
  std::vector<double> probabilities;
  /// The model's score of every class (the logits the probabilities are the softmax of).
  std::vector<double> logits;
};

/// The predictions for a batch or a dataset, in the samples' order.
class Predictions {
 public:
  Predictions() = default;
  /// `logits` [N, C]: the model's scores; the probabilities are their softmax.
  Predictions(torch::Tensor logits, torch::Tensor probabilities, std::vector<std::string> class_names)
      : logits_(std::move(logits)), probabilities_(std::move(probabilities)), names_(std::move(class_names)) {}

  std::int64_t size() const { return probabilities_.defined() ? probabilities_.size(0) : 0; }
  /// [N, C] float: row i is sample i's probability of each class.
  const torch::Tensor& probabilities() const { return probabilities_; }
  /// [N, C] float: the model's scores before the softmax (what transformers calls logits), for
  /// comparing with another implementation, calibrating or ensembling.
  const torch::Tensor& logits() const { return logits_; }
  /// [N] int64: the most probable class of each sample.
  torch::Tensor classes() const { return probabilities_.argmax(1); }
  const std::vector<std::string>& class_names() const { return names_; }

  Prediction operator[](std::int64_t i) const;

 private:
  torch::Tensor logits_, probabilities_;
  std::vector<std::string> names_;
};

/// A model in evaluation mode that turns inputs into class probabilities. `Model` is a module
/// handle: a TORCH_MODULE holder (torch::nn::Sequential, ...) or a shared_ptr to a module.
///
///   auto predictor = Predictor<Net>::best(result.path, run.checkpoint, Net{}, class_names);
///   auto p = predictor.predict(images);          // p[i].label, p[i].probabilities
///   auto all = predictor.predict(ctx, test, 2000); // inside fit(): split over the ranks, in order
template <class Model>
class Predictor {
 public:
  /// `model` as it is (already loaded); `class_names[k]` names class k (empty: "0", "1", ...).
  Predictor(Model model, std::vector<std::string> class_names = {}, torch::Device device = torch::kCPU)
      : model_(std::move(model)), names_(std::move(class_names)), device_(device) {
    module().to(device_);
    module().eval();
  }

  /// Loads checkpoint directory `checkpoint_dir` (checkpoint_NNNNNN, as Result::best_checkpoint()
  /// or checkpoints.json name it) into `model`. Throws ConfigError when there is no checkpoint
  /// there, when it is damaged or incomplete (its manifest does not verify), or when its tensors
  /// do not fit `model`; the message says which and what to pass instead.
  static Predictor from_checkpoint(const std::filesystem::path& checkpoint_dir, Model model,
                                   std::vector<std::string> class_names = {}, torch::Device device = torch::kCPU) {
    return from_checkpoint(open(checkpoint_dir), std::move(model), std::move(class_names), device);
  }

  /// The model built from the checkpoint's own model_config.json (a model with `Config config;`,
  /// checkpointer/model_config.hpp), no sizes given, and loaded. ConfigError when the checkpoint
  /// was saved from another model type (naming both) or says nothing of its config.
  static Predictor from_checkpoint(const std::filesystem::path& checkpoint_dir, torch::Device device = torch::kCPU) {
    const auto ck = open(checkpoint_dir);
    return from_checkpoint(ck, checkpointer::build_model<Model>(ck), {}, device);
  }

  /// Loads checkpoint directory `checkpoint_dir` into `model` with the preprocessing `inputs`
  /// restores from the checkpoint's objects (TextInputs, evaluation::ImageInputs): predict(raw)
  /// then takes raw texts or image files, and the predictions carry the saved class names.
  template <InputsFromCheckpoint Inputs>
  static Predictor from_checkpoint(const std::filesystem::path& checkpoint_dir, Model model, const Inputs& inputs,
                                   torch::Device device = torch::kCPU) {
    const auto ck = open(checkpoint_dir);
    return with_inputs(from_checkpoint(ck, std::move(model), {}, device), ck, [&] { return inputs.restore(ck); });
  }
  /// The same, the model built from the checkpoint's model_config.json: a checkpoint alone serves.
  template <InputsFromCheckpoint Inputs>
  static Predictor from_checkpoint(const std::filesystem::path& checkpoint_dir, const Inputs& inputs,
                                   torch::Device device = torch::kCPU) {
    const auto ck = open(checkpoint_dir);
    return with_inputs(from_checkpoint(ck, checkpointer::build_model<Model>(ck), {}, device), ck,
                       [&] { return inputs.restore(ck); });
  }

  /// Raw inputs through preprocessing of a type of your own, `Preprocessing` (TextInputs and
  /// ImageInputs restore dtrain's tokenizers and image preprocessing by the type each object
  /// records, unnamed): `Predictor<Net>::from_checkpoint<MyTokenizer>(dir, TextInputs{})`; or with
  /// a model: `(dir, Net{...}, TextInputs{})`.
  template <class Preprocessing, InputsFromCheckpoint Inputs>
  static Predictor from_checkpoint(const std::filesystem::path& checkpoint_dir, Model model, const Inputs& inputs,
                                   torch::Device device = torch::kCPU) {
    const auto ck = open(checkpoint_dir);
    return with_inputs(from_checkpoint(ck, std::move(model), {}, device), ck,
                       [&] { return inputs.template restore<Preprocessing>(ck); });
  }
  template <class Preprocessing, InputsFromCheckpoint Inputs>
  static Predictor from_checkpoint(const std::filesystem::path& checkpoint_dir, const Inputs& inputs,
                                   torch::Device device = torch::kCPU) {
    const auto ck = open(checkpoint_dir);
    return with_inputs(from_checkpoint(ck, checkpointer::build_model<Model>(ck), {}, device), ck,
                       [&] { return inputs.template restore<Preprocessing>(ck); });
  }

  /// The predictions for raw inputs (texts, or image files' paths) through the preprocessing
  /// restored by from_checkpoint(dir, [model,] TextInputs{} or ImageInputs{}).
  Predictions predict(const std::vector<std::string>& raw) {
    if constexpr (takes_fields)
      if (raw_.fields) return predict(raw_.fields(raw));
    if constexpr (requires(Model& m, const torch::Tensor& t) { m->forward(t); })
      if (raw_.tensor) return predict(raw_.tensor(raw));
    if (raw_.fields || raw_.tensor)
      throw ConfigError(std::string("Predictor::predict(raw inputs): the restored preprocessing makes ") +
                        (raw_.fields ? "named fields, and the model has neither forward(const dtrain::data::Fields&) "
                                       "nor forward(input_ids, attention_mask)"
                                     : "a tensor, and the model has no forward(const torch::Tensor&)"));
    throw ConfigError("Predictor::predict(raw inputs): this predictor has no preprocessing for raw inputs; load it "
                      "with Predictor::from_checkpoint(dir, dtrain::evaluation::TextInputs{}) for texts or "
                      "(dir, dtrain::evaluation::ImageInputs{}) for image files");
  }

  /// Loads an opened checkpoint into `model`.
  static Predictor from_checkpoint(const checkpointer::Checkpoint& checkpoint, Model model,
                                   std::vector<std::string> class_names = {}, torch::Device device = torch::kCPU) {
    try {
      checkpoint.load_model(model);
    } catch (const std::exception& e) {
      throw ConfigError("Predictor: checkpoint " + checkpoint.path().string() + " does not fit the model: " +
                        e.what() + ". Build the model with the architecture that was trained");
    }
    return Predictor(std::move(model), std::move(class_names), device);
  }

  /// Loads the best valid checkpoint of run directory `run_dir` by `config` (score_attribute and
  /// score_order, as the run's RunConfig::checkpoint). Throws ConfigError when the directory does
  /// not exist or holds no valid checkpoint.
  static Predictor best(const std::filesystem::path& run_dir, const CheckpointConfig& config, Model model,
                        std::vector<std::string> class_names = {}, torch::Device device = torch::kCPU) {
    return from_checkpoint(best_of(run_dir, config), std::move(model), std::move(class_names), device);
  }

  /// The best valid checkpoint of `run_dir` by `config`, its model built from its model_config.json.
  static Predictor best(const std::filesystem::path& run_dir, const CheckpointConfig& config,
                        std::vector<std::string> class_names = {}, torch::Device device = torch::kCPU) {
    const auto ck = best_of(run_dir, config);
    return from_checkpoint(ck, checkpointer::build_model<Model>(ck), std::move(class_names), device);
  }

  /// The predictions for a batch of inputs (one sample per row of the first dimension).
  Predictions predict(const torch::Tensor& inputs) { return predictions(scores_of(inputs)); }

  /// The predictions for every sample of `data`, `batch` at a time, in order; `cm`, when given,
  /// is updated batch by batch with the predictions against the data's targets.
  template <data::RandomAccess Dataset>
  Predictions predict(const Dataset& data, std::int64_t batch, ConfusionMatrix* cm = nullptr) {
    if (batch < 1) throw ConfigError("Predictor::predict: batch must be at least 1, got " + std::to_string(batch));
    std::vector<torch::Tensor> logits, probs;
    const auto n = static_cast<std::int64_t>(data.size());
    for (std::int64_t begin = 0; begin < n; begin += batch) {
      const auto b = data.get_batch(torch::arange(begin, std::min(n, begin + batch), torch::kInt64));
      logits.push_back(scores_of(b));
      probs.push_back(softmax(logits.back()));
      if (cm) cm->update(probs.back(), target_of(b));
    }
    if (logits.empty()) return {torch::empty({0, 0}), torch::empty({0, 0}), names_for(num_classes_)};
    return {torch::cat(logits), torch::cat(probs), names_for(num_classes_)};
  }

  /// Inside fit(): every rank predicts its contiguous block of `data` (sampler::sequential,
  /// `global_batch` / world_size samples per batch), and every rank gets all predictions gathered
  /// in the dataset's order. `cm`, when given, is updated batch by batch on each rank, then summed
  /// over the ranks: it equals the one-process matrix exactly. Call it on every rank.
  template <class Context, data::RandomAccess Dataset>
  Predictions predict(Context& ctx, const Dataset& data, std::int64_t global_batch, ConfusionMatrix* cm = nullptr) {
    std::vector<torch::Tensor> parts;  // each batch's [logits | probabilities]
    for (const auto& b : ctx.shard(data, global_batch, sampler::sequential{})) {
      const auto logits = scores_of(b);
      parts.push_back(torch::cat({logits, softmax(logits)}, 1));
      if (cm) cm->update(parts.back().narrow(1, logits.size(1), logits.size(1)), target_of(b));
    }
    // Ranks agree on the class count even when one of them had no sample.
    const auto classes = static_cast<std::int64_t>(
        ctx.all_reduce(static_cast<double>(num_classes_.value_or(0)), reduce::max));
    const auto n = static_cast<std::int64_t>(data.size());
    const int world = ctx.world_size();
    const auto rows = sampler::sequential::samples_per_rank(n, world, 0);  // the largest block
    auto padded = torch::zeros({rows, 2 * classes}, torch::kFloat32);
    if (!parts.empty()) {
      auto mine = torch::cat(parts);
      padded.narrow(0, 0, mine.size(0)).copy_(mine);
    }
    std::vector<torch::Tensor> gathered;
    for (int r = 0; r < world; ++r) gathered.push_back(torch::empty_like(padded));
    ctx.communicator().allgather(gathered, padded).wait();
    for (int r = 0; r < world; ++r) gathered[r] = gathered[r].narrow(0, 0, sampler::sequential::samples_per_rank(n, world, r));
    if (cm) ctx.all_reduce(*cm);
    num_classes_ = classes;
    const auto all = torch::cat(gathered);
    return {all.narrow(1, 0, classes).contiguous(), all.narrow(1, classes, classes).contiguous(), names_for(classes)};
  }

  /// A batch of named fields (data::Fields) goes to the model whole, `model->forward(fields)`;
  /// its targets, for a ConfusionMatrix, are this field (default "label").
  Predictor& label_field(std::string name) {
    label_field_ = std::move(name);
    return *this;
  }
  /// A causal LM's continuation of each prompt (nn::LlamaForCausalLM, nn::GPT2LMHeadModel): the
  /// texts through the tokenizer TextInputs restored (left-padded), nn::generate with `options`,
  /// the new tokens decoded (special tokens skipped). A prompt in, its generated text out:
  ///   auto llm = Predictor<nn::LlamaForCausalLM>::from_checkpoint(dir, TextInputs{});
  ///   auto text = llm.generate({"Once upon a time"}, {.max_new_tokens = 64})[0];
  /// ConfigError when the predictor has no tokenizer that decodes (restore it with TextInputs{}
  /// from a checkpoint that saved a data::BpeTokenizer).
  std::vector<std::string> generate(const std::vector<std::string>& prompts, nn::GenerationOptions options = {}) {
    static_assert(nn::CausalLM<dtrain::detail::module_of_t<Model>>,
                  "dtrain::evaluation::Predictor<Model>::generate: Model must be a causal LM (nn::LlamaForCausalLM, "
                  "nn::GPT2LMHeadModel: next_token_logits and config.eos_token_id); a classifier's predictions are predict()");
    if (!raw_.prompts || !raw_.decode)
      throw ConfigError("Predictor::generate: this predictor has no tokenizer that decodes; load it with "
                        "Predictor::from_checkpoint(dir, dtrain::evaluation::TextInputs{}) from a checkpoint that saved a "
                        "data::BpeTokenizer (ctx.checkpoint(model, opt).with_object(\"vocab\", tokenizer))");
    if (prompts.empty()) return {};
    const auto [ids, mask] = raw_.prompts(prompts);
    const auto out = nn::generate(model_, ids.to(device_), mask.to(device_), std::move(options)).to(torch::kCPU);
    std::vector<std::string> texts;
    for (std::int64_t i = 0; i < out.size(0); ++i) texts.push_back(raw_.decode(out[i].narrow(0, ids.size(1), out.size(1) - ids.size(1))));
    return texts;
  }

  /// The predictions for a batch of named fields: `model->forward(fields)` gives the scores.
  Predictions predict(const data::Fields& fields) { return predictions(scores_of(fields)); }
  /// The predictions for a dataset's batch of inputs and targets: `model->forward(batch.data)`.
  Predictions predict(const data::Batch& batch) { return predictions(scores_of(batch)); }

  /// The class names the predictions carry ("0", "1", ... when none were given, once the class
  /// count is known from a prediction).
  std::vector<std::string> class_names() const { return names_for(num_classes_); }
  Predictor& set_class_names(std::vector<std::string> names) {
    names_ = std::move(names);
    return *this;
  }

  Model& model() { return model_; }

 private:
  // The checkpoint at `dir`, verified; ConfigError saying what to pass instead.
  static checkpointer::Checkpoint open(const std::filesystem::path& dir) {
    std::error_code ec;
    if (!std::filesystem::exists(dir, ec))
      throw ConfigError("Predictor: there is no checkpoint at " + dir.string() +
                        " (no such file or directory); pass a checkpoint_NNNNNN directory of a run, such as "
                        "Result::best_checkpoint()->path(), or use Predictor::best(run directory, ...)");
    std::string why;
    auto ck = checkpointer::Checkpoint::open(dir, &why);
    if (!ck)
      throw ConfigError("Predictor: " + dir.string() + " is not a usable checkpoint: " + why +
                        ". Pass a complete checkpoint_NNNNNN directory (its manifest.json must verify), "
                        "or use Predictor::best(run directory, ...) to pick the best valid one");
    return *std::move(ck);
  }
  // The best valid checkpoint of `run_dir`; ConfigError when there is none.
  static checkpointer::Checkpoint best_of(const std::filesystem::path& run_dir, const CheckpointConfig& config) {
    std::error_code ec;
    if (!std::filesystem::is_directory(run_dir, ec))
      throw ConfigError("Predictor::best: there is no run directory at " + run_dir.string() +
                        "; pass RunConfig::path() (storage_path / name) of a run that saved checkpoints");
    auto ck = checkpointer::best_valid(run_dir, config);
    if (!ck)
      throw ConfigError("Predictor::best: " + run_dir.string() + " holds no valid checkpoint; a run saves them "
                        "with ctx.report(metrics, ctx.checkpoint(model, optimizer)) under "
                        "checkpointer::directory<>");
    return *std::move(ck);
  }
  // The preprocessing `restore()` makes, on `p`; what fails (a missing object, one of another
  // type) fails the same way every time: a ConfigError, which a batch job does not restart.
  template <class Restore>
  static Predictor with_inputs(Predictor p, const checkpointer::Checkpoint& ck, Restore restore) {
    try {
      p.raw_ = restore();
    } catch (const ConfigError&) {
      throw;
    } catch (const std::exception& e) {
      throw ConfigError("Predictor: checkpoint " + ck.path().string() +
                        ": the preprocessing for raw inputs cannot be restored: " + e.what());
    }
    p.names_ = p.raw_.class_names;
    return p;
  }

  // A model that takes a batch of named fields: forward(const data::Fields&), or transformers'
  // forward(input_ids, attention_mask) (nn::BertForSequenceClassification), given those fields.
  static constexpr bool fields_whole = requires(Model& m, const data::Fields& f) { m->forward(f); };
  static constexpr bool takes_fields =
      fields_whole || requires(Model& m, const torch::Tensor& t) { m->forward(t, t); };

  torch::Tensor scores_of(const data::Batch& b) { return scores_of(b.data); }
  torch::Tensor scores_of(const data::Fields& b) {
    static_assert(takes_fields,
                  "dtrain::evaluation::Predictor<Model>: a batch of named fields (data::Fields: a pipeline's "
                  "batches, or texts through TextInputs) goes to the model as model->forward(fields), or as "
                  "model->forward(b[\"input_ids\"], b[\"attention_mask\"]), and Model has neither "
                  "forward(const dtrain::data::Fields&) nor forward(input_ids, attention_mask). Add one that "
                  "picks the inputs, e.g. torch::Tensor forward(const dtrain::data::Fields& b) { return "
                  "forward(b[\"input_ids\"], b[\"attention_mask\"]); }");
    torch::NoGradGuard no_grad;
    const auto on_device = b.to(device_);
    if constexpr (fields_whole) {
      return checked(model_->forward(on_device));
    } else if constexpr (takes_fields) {
      if (!on_device.contains("input_ids"))
        throw ConfigError("Predictor: the model takes forward(input_ids, attention_mask) and the batch has no field "
                          "\"input_ids\" (it has the fields the preprocessing made); name the ids field input_ids, "
                          "as TextInputs does");
      const auto mask = on_device.contains("attention_mask") ? on_device["attention_mask"] : torch::Tensor{};
      return checked(model_->forward(on_device["input_ids"], mask));
    }
    return {};
  }
  torch::Tensor scores_of(const torch::Tensor& inputs) {
    torch::NoGradGuard no_grad;
    return checked(model_->forward(inputs.to(device_)));
  }
  const torch::Tensor& target_of(const data::Batch& b) const { return b.target; }
  const torch::Tensor& target_of(const data::Fields& b) const { return b.at(label_field_); }

  torch::nn::Module& module() {
    if constexpr (std::is_base_of_v<torch::nn::Module, Model>) return model_;
    else return static_cast<torch::nn::Module&>(*model_);
  }

  // The model's scores for a batch, float32 on the CPU: [batch, classes], one per class name.
  torch::Tensor checked(const torch::Tensor& scores) {
    if (scores.dim() != 2)
      throw ConfigError("Predictor: the model gives scores of shape " + c10::str(scores.sizes()) +
                        " for a batch; a classifier gives [batch, classes]");
    if (!names_.empty() && scores.size(1) != static_cast<std::int64_t>(names_.size()))
      throw ConfigError("Predictor: the model gives " + std::to_string(scores.size(1)) + " scores per sample but " +
                        std::to_string(names_.size()) + " class names were given; give one name per class");
    num_classes_ = scores.size(1);
    return scores.to(torch::kFloat32).to(torch::kCPU);
  }
  static torch::Tensor softmax(const torch::Tensor& logits) { return torch::softmax(logits, 1); }
  Predictions predictions(torch::Tensor logits) {
    auto probs = softmax(logits);
    return {std::move(logits), std::move(probs), names_for(num_classes_)};
  }

  std::vector<std::string> names_for(std::optional<std::int64_t> classes) const {
    if (!names_.empty() || !classes) return names_;
    std::vector<std::string> numbered;
    for (std::int64_t k = 0; k < *classes; ++k) numbered.push_back(std::to_string(k));
    return numbered;
  }

  Model model_;
  std::vector<std::string> names_;
  torch::Device device_;
  std::optional<std::int64_t> num_classes_;
  std::string label_field_ = "label";
  RawInputs raw_;  // raw texts or image files to a batch (none: tensors and fields only)
};

/// The names of `names` (an array of string_view, such as data::FashionMnist::class_names) as
/// strings, for Predictor and ctx.record_evaluation.
template <class Names>
std::vector<std::string> class_names(const Names& names) {
  std::vector<std::string> out;
  for (const auto& n : names) out.emplace_back(n);
  return out;
}

}  // namespace evaluation

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/evaluation/impl/predictor.ipp>
#endif
