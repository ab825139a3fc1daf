// SPDX-License-Identifier: Apache-2.0
#pragma once
// data::CausalLMData: instruction or plain-text records as a causal LM trains on them. Each record
// is a document: [BOS] prompt response EOS (the `prompt` and `response` columns), or [BOS] text EOS
// (a `text` column), tokenized by a data::BpeTokenizer. Labels are the ids themselves (the loss
// shifts them: nn::causal_lm_loss), -100 on the prompt (unless train_on_prompt), on each document's
// first token and on padding, so only the response teaches.
//
//   const auto tokenizer = dtrain::data::BpeTokenizer::from_directory(model_dir);
//   const dtrain::data::CausalLMData train("train.jsonl", tokenizer, {.max_length = 256});
//   for (auto batch : ctx.shard(train, 8))      // a dataset itself (data::RandomAccess)
//     loss = dtrain::nn::causal_lm_loss(ctx.forward(lm, batch), batch["labels"]);
//
// Packed (the default), documents are laid one after another into rows of exactly max_length
// tokens (a document is never split; what a row has left is padding), with position_ids that
// count from 0 in each document: the decoder families then keep each document's attention to
// itself (nn::packed_documents), as transformers does for packed rows, so packing changes no
// logit. Unpacked, a row is one document and a batch is padded to its longest row, with an
// attention_mask. Either way rows are fixed once read; the sampler shuffles them each epoch.

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <torch/types.h>

#include <dtrain/data/bpe_tokenizer.hpp>
#include <dtrain/data/fields.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace data {

struct CausalLMOptions {
  /// Tokens a row holds (at most the model's context). A document longer than this keeps its
  /// prompt and loses the end of its response (truncated() counts them); a prompt that does not
  /// fit with one response token is a DataError naming the record.
  std::int64_t max_length = 512;
  /// Pack documents into rows of max_length (else one document a row, padded per batch).
  bool pack = true;
  /// Labels on the prompt's tokens too (the loss then learns the prompts as well).
  bool train_on_prompt = false;
  /// The columns: prompt and response, or text when a record has no prompt column.
  std::string prompt_column = "prompt", response_column = "response", text_column = "text";
};

class CausalLMData {
 public:
  /// Reads a JSON Lines (.jsonl, .json) or CSV (.csv) file of records. DataError naming the file
  /// and line for a record without the columns, an unknown extension, an empty file, or a
  /// tokenizer without an end-of-sequence token (BpeTokenizer::with_eos names one).
  CausalLMData(const std::filesystem::path& path, const BpeTokenizer& tokenizer, CausalLMOptions options = {});
  /// Records already in memory: (prompt, response) pairs; an empty prompt makes a text document.
  static CausalLMData from_records(const std::vector<std::pair<std::string, std::string>>& records,
                                   const BpeTokenizer& tokenizer, CausalLMOptions options = {});

  /// Rows: packed rows, or documents.
  std::int64_t size() const { return static_cast<std::int64_t>(rows_.size()); }
  /// Row `i`: input_ids and labels [length], and position_ids [max_length] when packed.
  Fields operator[](std::int64_t i) const;
  /// The rows at `indices` as a batch: input_ids and labels [rows, max_length] with position_ids
  /// (packed), or padded to the longest row (input_ids with the pad id, labels with -100) with an
  /// attention_mask of 1 and 0.
  Fields get_batch(const torch::Tensor& indices) const;

  std::int64_t documents() const { return documents_; }
  /// Tokens that carry a label (what the loss averages over), in all rows.
  std::int64_t label_tokens() const { return label_tokens_; }
  /// Documents whose response was cut to fit max_length.
  std::int64_t truncated() const { return truncated_; }
  const CausalLMOptions& options() const { return options_; }

 private:
  CausalLMData(CausalLMOptions options, std::int64_t pad_id) : options_(std::move(options)), pad_id_(pad_id) {}
  struct Row {
    std::vector<std::int64_t> ids, labels, positions;
  };
  void add_document(std::vector<std::int64_t> prompt, std::vector<std::int64_t> response, const std::string& where);
  void finish();

  CausalLMOptions options_;
  std::int64_t pad_id_ = 0;
  std::vector<Row> rows_;
  std::int64_t documents_ = 0, label_tokens_ = 0, truncated_ = 0;
  std::vector<Row> pending_;  // documents before packing
};

}  // namespace data

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/data/impl/causal_lm.ipp>
#endif
