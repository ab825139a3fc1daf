// SPDX-License-Identifier: Apache-2.0
// docs/data.md's C++ blocks: a CSV of texts and tags, split, preprocessed, trained on by 2 workers
// through a pipeline, validated, checkpointed with its preprocessors, and predicted from raw
// strings. `snippets data text` runs them.

#include "snippets.hpp"

// [includes]
#include <dtrain/dtrain.hpp>      // the Trainer, its policies, FashionMnist and TensorDataset
#include <dtrain/data.hpp>        // everything on this page but the image headers (see Images)
#include <dtrain/inference.hpp>   // evaluation::validate, Predictor, batch_predict
// [includes]

#include <filesystem>
#include <fstream>
#include <iostream>
#include <numeric>
#include <string>
#include <vector>

namespace snippets {
namespace {

// A small corpus: two tags whose descriptions use different words.
void write_corpus(const std::string& path) {
  std::ofstream out(path);
  out << "id,title,description,tag\n";
  const std::vector<std::string> admin = {"disk", "partition", "backup", "user", "quota", "log"};
  const std::vector<std::string> net = {"network", "proxy", "dns", "socket", "http", "packet"};
  for (int i = 0; i < 200; ++i) {
    const auto& words = i % 2 ? net : admin;
    out << i << ",tool" << i << ",\"" << words[i % 6] << ", " << words[(i / 2) % 6] << " and \"\"" << words[(i / 3) % 6]
        << "\"\"\"," << (i % 2 ? "net" : "admin") << "\n";
  }
}

// [model]
// Token ids and their mask in, class scores out: the mean of the unpadded tokens' embeddings.
struct BagImpl : torch::nn::Module {
  BagImpl(std::int64_t vocab, std::int64_t classes)
      : emb(register_module("emb", torch::nn::Embedding(vocab, 32))), fc(register_module("fc", torch::nn::Linear(32, classes))) {}
  torch::Tensor forward(const torch::Tensor& ids, const torch::Tensor& mask) {
    const auto keep = mask.unsqueeze(-1).to(torch::kFloat32);
    return fc((emb(ids) * keep).sum(1) / keep.sum(1).clamp_min(1));
  }
  // The Predictor hands a model the batch's fields.
  torch::Tensor forward(const dtrain::data::Fields& b) { return forward(b["input_ids"], b["attention_mask"]); }
  torch::nn::Embedding emb;
  torch::nn::Linear fc;
};
TORCH_MODULE(Bag);
// [model]

int text() {
  fresh_directory("data_text");
  write_corpus("dataset.csv");
  // [text]
  namespace data = dtrain::data;
  const auto corpus = data::read_csv("dataset.csv", {.types = {{"id", data::column_type::integer}}});  // one read
  std::vector<std::string> texts, tags;  // to split and fit
  for (std::int64_t i = 0; i < corpus.size(); ++i) {
    const auto row = corpus.row(i);
    texts.push_back(row.text("title") + " " + row.text("description"));
    tags.push_back(row.text("tag"));
  }
  const auto split = data::stratified_split(tags, /*validation=*/0.2, /*test=*/0.0, /*seed=*/0);
  std::vector<std::string> train_texts, train_tags;
  for (auto i : split.train) {
    train_texts.push_back(texts[i]);
    train_tags.push_back(tags[i]);
  }
  const auto vocab = data::WordVocabulary::fit(train_texts, /*max_words=*/20000, /*max_len=*/128);
  const auto labels = data::LabelEncoder::fit(train_tags);

  // Rows become named tensors on loader threads; batches are padded to their longest text.
  auto encode = data::map([&](const data::Row& row) {
                  return data::Fields{{"input_ids", vocab.transform(row.text("title") + " " + row.text("description"))},
                                      {"label", torch::tensor(labels.transform(row.text("tag")))}};
                }) |
                data::collate(data::pad_to_longest("input_ids"));  // adds "attention_mask"
  const auto train = data::pipelined(data::Subset(corpus, split.train), encode, {.loader_threads = 2});
  const auto val = data::pipelined(data::Subset(corpus, split.validation), encode, {.loader_threads = 2});

  using Trainer = dtrain::Trainer<Bag, std::decay_t<decltype(train)>, dtrain::checkpointer::directory<>>;
  dtrain::RunConfig run{.storage_path = "runs", .name = "tags"};
  run.checkpoint = {.num_to_keep = 1, .score_attribute = "val_loss", .score_order = dtrain::ScoreOrder::min};
  Trainer trainer({.num_workers = 2}, run);
  auto result = trainer.fit([&](Trainer::context& ctx) {
    auto model = ctx.prepare_model(Bag(vocab.size(), labels.size()));
    torch::optim::Adam opt(ctx.parameters(model), 1e-2);
    if (auto ck = ctx.get_checkpoint()) ctx.restore(*ck, model, opt);
    for (auto epoch : ctx.epochs(4)) {
      model->train();
      for (const auto& b : ctx.shard(train, 32)) {
        opt.zero_grad();
        auto logits = ctx.forward(model, b["input_ids"], b["attention_mask"]);
        ctx.backward(torch::nn::functional::cross_entropy(logits, b["label"]));
        ctx.step(opt);
      }
      model->eval();
      const auto v = dtrain::evaluation::validate(ctx, val, 32, [&](const data::Fields& b) {
        return dtrain::evaluation::Scored{ctx.forward(model, b["input_ids"], b["attention_mask"]), b["label"]};
      });  // float64 sums over the ranks: the same numbers on any worker count
      ctx.report({{"epoch", epoch}, {"val_loss", v.loss}, {"val_accuracy", v.accuracy}},
                 ctx.checkpoint(model, opt).with_object("vocab", vocab).with_object("labels", labels));
    }
  });

  // The best checkpoint brings its vocabulary and label names: raw strings in, tags out.
  using Predictor = dtrain::evaluation::Predictor<Bag>;
  auto predictor = Predictor::from_checkpoint(result.best_checkpoint()->path(), Bag(vocab.size(), labels.size()),
                                              dtrain::evaluation::TextInputs{});
  const auto p = predictor.predict(std::vector<std::string>{"a dns proxy", "disk quota and backup"});
  // p[0].label == "net", p[1].label == "admin"
  // [text]
  std::cout << "data: val_accuracy " << result.metrics.at("val_accuracy").number() << ", predicted " << p[0].label
            << " and " << p[1].label << "\n";
  return 0;
}

// A model directory as the hub ships one, cut down: a vocab.txt of BERT's special tokens and a
// few pieces (the real ones come with the model: tokenizer.json, vocab.txt).
void write_model_dir(const std::string& dir) {
  std::filesystem::create_directories(dir);
  std::ofstream out(dir + "/vocab.txt");
  for (const char* piece : {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "dns", "proxy", "disk", "quota", "and",
                            "back", "##up", "?", ".", "what", "is", "it"})
    out << piece << "\n";
}

int wordpiece() {
  fresh_directory("data_wordpiece");
  write_model_dir("model");
  const std::string model_dir = "model";
  const std::vector<std::string> texts = {"A DNS proxy", "Disk quota and backup"};
  // [wordpiece]
  namespace data = dtrain::data;
  // tokenizer.json when the directory has one (Hugging Face tokenizers' file), else vocab.txt
  // with Options (.lowercase, .strip_accents, .max_length, the special tokens' names).
  const auto tokenizer = data::WordPieceTokenizer::from_directory(model_dir);
  const auto ids = tokenizer.encode("A DNS proxy");  // [CLS] a dns proxy [SEP]
  const auto pair = tokenizer.encoding("What is it?", "A disk quota.");  // .input_ids, .attention_mask, .token_type_ids
  const auto batch = tokenizer.encode_batch(texts);  // one encoding a text: batch[i].input_ids, ...; on every core, padded as tokenizer.json says

  // In a pipeline: ids per text, padded to the batch's longest with the vocabulary's [PAD].
  auto encode = data::map([&](const data::Row& row) {
                  return data::Fields{{"input_ids", tokenizer.transform(row.text("description"))}};
                }) |
                data::collate(data::pad_to_longest("input_ids", tokenizer.pad_id()));  // adds "attention_mask"
  // Saved with a checkpoint, ctx.checkpoint(model, opt).with_object("vocab", tokenizer), and back:
  //   Predictor<Net>::from_checkpoint(dir, Net{...}, TextInputs{})  // the checkpoint says it is WordPiece
  // [wordpiece]
  std::cout << "wordpiece: " << ids.size() << " ids, pair types " << pair.token_type_ids.size() << ", batch "
            << batch.size() << ", pad " << tokenizer.pad_id() << "\n";
  (void)encode;
  return 0;
}

// A decoder model's directory, cut down: a byte-level BPE tokenizer.json in Llama 3's form (every
// byte, a few merges, <|begin_of_text|> before each text) and transformers' tokenizer_config.json.
// The real ones come with the model; the tests train them with tokenizers (tests/data/check_bpe.py).
void write_bpe_model_dir(const std::string& dir) {
  namespace bpe = dtrain::data::detail::bpe;
  std::filesystem::create_directories(dir);
  nlohmann::json vocab = nlohmann::json::object(), merges = nlohmann::json::array();
  for (std::size_t b = 0; b < 256; ++b) vocab[bpe::byte_chars()[b]] = b;
  for (const auto& [a, b] : std::vector<std::pair<std::string, std::string>>{
           {"H", "e"}, {"l", "l"}, {"He", "ll"}, {"Hell", "o"}, {"Ġ", "w"}, {"o", "r"}, {"Ġw", "or"}, {"l", "d"}, {"Ġwor", "ld"}}) {
    vocab[a + b] = vocab.size();
    merges.push_back({a, b});
  }
  const auto special = [](const char* t) {
    return nlohmann::json{{"content", t}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                          {"normalized", false}, {"special", true}};
  };
  const auto bos = vocab.size();
  const nlohmann::json tokenizer = {
      {"added_tokens", {special("<|begin_of_text|>"), special("<|end_of_text|>")}},
      {"pre_tokenizer", {{"type", "Sequence"},
                         {"pretokenizers", {{{"type", "Split"}, {"pattern", {{"Regex", std::string(bpe::kLlama3Pattern)}}},
                                             {"behavior", "Isolated"}, {"invert", false}},
                                            {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}}},
      {"post_processor", {{"type", "TemplateProcessing"},
                          {"single", {{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
                                      {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
                          {"pair", nlohmann::json::array()},
                          {"special_tokens", {{"<|begin_of_text|>", {{"id", "<|begin_of_text|>"}, {"ids", {bos}},
                                                                    {"tokens", {"<|begin_of_text|>"}}}}}}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"ignore_merges", true}, {"vocab", vocab}, {"merges", merges}}}};
  std::ofstream(dir + "/tokenizer.json") << tokenizer.dump();
  std::ofstream(dir + "/tokenizer_config.json") << nlohmann::json{{"eos_token", "<|end_of_text|>"}}.dump();
}

int bpe() {
  fresh_directory("data_bpe");
  write_bpe_model_dir("model");
  const std::string model_dir = "model";
  const std::vector<std::string> texts = {"Hello", "Hello world, Hello world"};
  // [bpe]
  namespace data = dtrain::data;
  // tokenizer.json (Hugging Face tokenizers' file), and tokenizer_config.json's bos, eos and pad tokens.
  const auto tokenizer = data::BpeTokenizer::from_directory(model_dir);
  const auto ids = tokenizer.encode("Hello world");           // <|begin_of_text|> Hello Ġworld: the file's template
  const auto plain = tokenizer.encode("Hello world", false);  // without the special tokens
  const auto text = tokenizer.decode(ids);                    // "Hello world" (special tokens skipped)
  const auto eos = tokenizer.eos_id();                        // where generation stops: std::optional<std::int64_t>

  // Prompts for a decoder: the last 512 ids of each, padded on the left to the batch's longest.
  using Side = data::BpeTokenizer::Side;
  const auto prompts = tokenizer.with_max_length(512, Side::left).with_padding(Side::left);
  const auto batch = prompts.encode_batch(texts);  // .input_ids, .attention_mask (0 on the padding), on every core
  // Saved with a checkpoint like the other tokenizers: ctx.checkpoint(model, opt).with_object("vocab", tokenizer)
  // [bpe]
  std::cout << "bpe: " << ids.size() << " ids, " << plain.size() << " without special tokens, decoded \"" << text
            << "\", eos " << (eos ? "set" : "none") << ", batch " << batch.size() << " of " << batch[0].input_ids.size()
            << ", padding " << batch[0].attention_mask[0] << "\n";
  return 0;
}

// [stage class]
// A pretrained encoder inside the pipeline: each instance loads the weights once, then embeds
// batches on the loader threads.
struct Embed {
  explicit Embed(const std::string& weights) {
    torch::load(encoder, weights);
    encoder->eval();
  }
  dtrain::data::Fields operator()(dtrain::data::Fields batch) {  // runs under c10::InferenceMode
    batch.set("embedding", torch::relu(encoder(batch["image"].flatten(1))));  // a column added,
    batch.erase("image");                                                     // one dropped
    return batch;
  }
  torch::nn::Linear encoder{784, 64};
};
// [stage class]

int stage() {
  fresh_directory("data_stage");
  torch::manual_seed(0);
  torch::save(torch::nn::Linear(784, 64), "encoder.pt");  // the "pretrained" weights
  const auto images = torch::rand({512, 1, 28, 28});
  const auto labels = torch::arange(512) % 2;
  // [stage]
  namespace data = dtrain::data;
  // Images by index, collated, then embedded: 2 instances of Embed at most, 64 images a call.
  auto embedded = data::map([&](std::int64_t i) { return data::Fields{{"image", images[i]}, {"label", labels[i]}}; }) |
                  data::collate(data::stack()) |
                  data::map_batches<Embed>({.concurrency = 2, .batch_size = 64, .name = "encoder"}, "encoder.pt");
  std::vector<std::int64_t> ids(images.size(0));
  std::iota(ids.begin(), ids.end(), 0);
  const auto train = data::pipelined(ids, embedded, {.loader_threads = 2});

  using Trainer = dtrain::Trainer<torch::nn::Linear, std::decay_t<decltype(train)>>;
  Trainer trainer({.num_workers = 2}, dtrain::RunConfig{.storage_path = "runs", .name = "embedded"});
  auto result = trainer.fit([&](Trainer::context& ctx) {  // each worker constructs its own Embed instances
    auto head = ctx.prepare_model(torch::nn::Linear(64, 2));
    torch::optim::Adam opt(ctx.parameters(head), 1e-2);
    for (auto epoch : ctx.epochs(2)) {
      for (const auto& b : ctx.shard(train, 128)) {  // b["embedding"]: [128, 64], b["label"]; no "image"
        opt.zero_grad();
        ctx.backward(torch::nn::functional::cross_entropy(ctx.forward(head, b["embedding"]), b["label"]));
        ctx.step(opt);
      }
      ctx.report({{"epoch", epoch}});
    }
  });
  // [stage]
  std::cout << "stage: last epoch " << result.metrics.at("epoch").number() << "\n";
  return 0;
}

}  // namespace

int data_page(const std::string& block) {
  if (block == "text") return text();
  if (block == "wordpiece") return wordpiece();
  if (block == "bpe") return bpe();
  if (block == "stage") return stage();
  std::cerr << "snippets data: no block " << block << "; the blocks are text, wordpiece, bpe and stage\n";
  return 2;
}

}  // namespace snippets
