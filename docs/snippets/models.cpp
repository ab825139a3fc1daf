// SPDX-License-Identifier: Apache-2.0
// docs/models.md's BERT block: a pretrained BERT-family encoder (the real all-MiniLM-L6-v2, whose
// directory is the program's argument) fine-tuned with a new 3-label head on 2 workers, then its
// checkpoint exported as a Hugging Face directory and served from the checkpoint alone: raw texts
// through a Predictor, and a list of texts through batch_predict on 2 workers. The data: 96 rows of
// token ids whose label is the token at position 1 (a stand-in for a tokenised corpus). Then
// docs/models.md's CLIP block: a CLIP directory loaded and its image and text features computed.
//   snippets_models MODEL_DIR

#include "snippets.hpp"

#include <iostream>

int main(int argc, char** argv) try {
  if (argc != 2) {
    std::cerr << "usage: snippets_models MODEL_DIR (a Hugging Face BERT directory: config.json, model.safetensors)\n";
    return 2;
  }
  const auto rows = [] {
    auto gen = at::detail::createCPUGenerator(27);
    auto ids = at::randint(1000, 5000, {96, 16}, gen);
    auto labels = at::arange(96) % 3;
    ids.select(1, 0).fill_(101);                                                    // [CLS]
    ids.select(1, 1).copy_(at::index_select(at::tensor({2919L, 7929L, 2204L}), 0, labels));  // bad, neutral, good
    ids.slice(1, 12).zero_();                                                       // padding
    ids.select(1, 11).fill_(102);                                                   // [SEP]
    return dtrain::data::TensorDataset{ids, labels};
  }();
  // [bert fine-tune]
  const std::filesystem::path pretrained = argv[1];  // all-MiniLM-L6-v2's directory
  auto config = dtrain::nn::BertConfig::from_pretrained(pretrained);
  config.id2label = {"negative", "neutral", "positive"};  // the task's labels: a new classifier
  const auto tokenizer = dtrain::data::WordPieceTokenizer::from_directory(pretrained).with_max_length(128);
  const auto labels = dtrain::data::LabelEncoder::fit(config.id2label);  // saved for serving
  using Bert = dtrain::nn::BertForSequenceClassification;
  using Trainer = dtrain::Trainer<Bert, dtrain::data::TensorDataset, dtrain::checkpointer::directory<>>;
  Trainer trainer({.num_workers = 2}, {.storage_path = "runs", .name = "minilm", .start = dtrain::Start::fresh});
  const auto result = trainer.fit([&](Trainer::context& ctx) {
    Bert bert(config);
    dtrain::nn::load_pretrained(*bert, pretrained);  // the encoder's weights; the classifier is new
    auto model = ctx.prepare_model(bert);
    torch::optim::AdamW opt(ctx.parameters(model), torch::optim::AdamWOptions(1e-4));
    for (auto epoch : ctx.epochs(2)) {
      model->train();
      double loss_sum = 0;
      int steps = 0;
      for (auto batch : ctx.shard(rows, 32)) {  // batch.data: token ids, 0 = [PAD]
        opt.zero_grad();
        auto logits = ctx.forward(model, batch.data, /*attention_mask=*/batch.data.ne(0), /*token_type_ids=*/torch::Tensor());
        auto loss = torch::nn::functional::cross_entropy(logits, batch.target);
        ctx.backward(loss);
        ctx.step(opt);
        loss_sum += loss.item<double>();
        ++steps;
      }
      ctx.report({{"epoch", epoch}, {"loss", ctx.all_reduce(loss_sum / steps)}},
                 ctx.checkpoint(model, opt).with_object("vocab", tokenizer).with_object("labels", labels));
    }
  });
  // Back to Python: the checkpoint's model (rebuilt from its config) as a Hugging Face directory.
  const auto& checkpoint = *result.latest_checkpoint();
  auto tuned = dtrain::checkpointer::build_model<Bert>(checkpoint);
  checkpoint.load_model(tuned);
  dtrain::nn::save_pretrained(*tuned, "minilm-tagger",
                              {.files = {pretrained / "tokenizer.json", pretrained / "vocab.txt",
                                         pretrained / "tokenizer_config.json", pretrained / "special_tokens_map.json"}});
  // [bert fine-tune]
  std::cout << "models: " << result.metrics_history.size() << " reports, loss "
            << result.metrics.at("loss").text() << ", exported "
            << dtrain::weights::read("minilm-tagger").size() << " tensors, labels "
            << dtrain::nn::BertConfig::from_pretrained("minilm-tagger").id2label.size() << "\n";
  // [bert serve]
  // The checkpoint alone serves raw texts: the model from its config, the tokenizer and the labels
  // it saved (TextInputs reads which tokenizer that is from the checkpoint).
  using Predictor = dtrain::evaluation::Predictor<dtrain::nn::BertForSequenceClassification>;
  auto predictor = Predictor::from_checkpoint(checkpoint.path(), dtrain::evaluation::TextInputs{});
  const auto p = predictor.predict({"a good film", "a bad one"});  // p[i].label, p[i].probabilities
  const auto logits = p.logits();                                 // [2, 3]: the model's scores
  // A list of texts scored on 2 workers: predictions/predictions.csv, one row a text, in order.
  const std::vector<std::string> texts(40, "good, if a little long");
  const auto job = dtrain::evaluation::batch_predict<dtrain::nn::BertForSequenceClassification>(
      checkpoint.path(), texts, dtrain::evaluation::TextInputs{},
      {.output = "predictions", .start = dtrain::Start::fresh}, {.num_workers = 2});
  // [bert serve]
  std::cout << "served: " << p[0].label.size() << "-letter label, logits " << logits.sizes() << ", batch "
            << job.samples << " rows of " << job.class_names.size() << " classes\n";

  {  // A small CLIP with random weights, written as transformers writes one, stands in for the hub's.
    dtrain::nn::CLIPConfig small;
    for (dtrain::nn::CLIPEncoderConfig* tower : {static_cast<dtrain::nn::CLIPEncoderConfig*>(&small.text_config),
                                                 static_cast<dtrain::nn::CLIPEncoderConfig*>(&small.vision_config)}) {
      tower->hidden_size = 32;
      tower->intermediate_size = 64;
      tower->num_hidden_layers = 2;
      tower->num_attention_heads = 4;
    }
    small.text_config.vocab_size = 100;
    small.text_config.eos_token_id = 99;
    small.vision_config.image_size = 32;
    small.vision_config.patch_size = 8;
    small.projection_dim = 24;
    dtrain::nn::save_pretrained(dtrain::nn::CLIPModel(small), "clip-small");
  }
  const std::filesystem::path clip_dir = "clip-small";
  // [clip features]
  auto clip_config = dtrain::nn::CLIPConfig::from_pretrained(clip_dir);  // clip_dir/config.json
  dtrain::nn::CLIPModel clip(clip_config);
  dtrain::nn::load_pretrained(clip, clip_dir);  // strict: every tensor by transformers' name
  clip->eval();
  c10::InferenceMode inference;
  const auto side = clip_config.vision_config.image_size;
  torch::Tensor image_embeds = clip->get_image_features(torch::randn({2, 3, side, side}));  // [2, projection_dim]
  const auto eos = clip_config.text_config.eos_token_id;
  const auto input_ids = torch::tensor({{5L, 6L, 7L, eos}, {8L, eos, 0L, 0L}});  // each row ends at its EOS
  const auto attention_mask = torch::tensor({{1L, 1L, 1L, 1L}, {1L, 1L, 0L, 0L}});
  torch::Tensor text_embeds = clip->get_text_features(input_ids, attention_mask);  // [2, projection_dim]
  // [clip features]
  std::cout << "clip: image features " << image_embeds.sizes() << ", text features " << text_embeds.sizes() << "\n";
  return 0;
} catch (const std::exception& e) {
  std::cerr << "snippets_models: " << e.what() << "\n";
  return 1;
}
