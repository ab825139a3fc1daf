// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of causal_lm.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <algorithm>

#include <dtrain/data/causal_lm.hpp>
#include <dtrain/data/csv.hpp>
#include <dtrain/data/jsonl.hpp>
#include <dtrain/error.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace data {
namespace detail {

// The ids a document starts with (the BOS the tokenizer's post-processor puts first) and ends with.
struct DocumentEnds {
  std::vector<std::int64_t> begin;
  std::int64_t eos = 0;
};

inline DocumentEnds document_ends(const BpeTokenizer& tokenizer, const std::string& origin) {
  if (!tokenizer.eos_id())
    throw DataError(origin + ": the tokenizer has no end-of-sequence token, which ends every document so that the model "
                             "learns to stop; name one (BpeTokenizer::with_eos)");
  DocumentEnds ends;
  if (tokenizer.add_bos() && tokenizer.bos_id()) ends.begin.push_back(*tokenizer.bos_id());
  ends.eos = *tokenizer.eos_id();
  return ends;
}

inline std::vector<std::int64_t> concat(std::vector<std::int64_t> a, const std::vector<std::int64_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}
}  // namespace detail

DTRAIN_INLINE CausalLMData::CausalLMData(const std::filesystem::path& path, const BpeTokenizer& tokenizer, CausalLMOptions options)
    : options_(std::move(options)), pad_id_(tokenizer.pad_id()) {
  const auto ends = detail::document_ends(tokenizer, path.string());
  const auto read = [&](const auto& source) {
    if (source.size() == 0) throw DataError(path.string() + ": no records; a causal-LM file needs at least one");
    for (std::int64_t i = 0; i < source.size(); ++i) {
      const auto row = source.row(i);
      if (row.contains(options_.prompt_column) && row.contains(options_.response_column))
        add_document(detail::concat(ends.begin, tokenizer.encode(row.text(options_.prompt_column), false)),
                     detail::concat(tokenizer.encode(row.text(options_.response_column), false), {ends.eos}), row.where());
      else if (row.contains(options_.text_column))
        add_document(ends.begin, detail::concat(tokenizer.encode(row.text(options_.text_column), false), {ends.eos}), row.where());
      else {
        std::string columns;
        for (const auto& c : row.columns()) columns += (columns.empty() ? "" : ", ") + c;
        throw DataError(row.where() + ": the record has neither \"" + options_.prompt_column + "\" and \"" +
                        options_.response_column + "\" nor \"" + options_.text_column + "\" (it has " + columns +
                        "); name its columns in CausalLMOptions");
      }
    }
  };
  const auto extension = path.extension().string();
  if (extension == ".jsonl" || extension == ".json") read(JsonLinesSource(path));
  else if (extension == ".csv") read(CsvSource(path));
  else
    throw DataError(path.string() + ": a causal-LM file is JSON Lines (.jsonl) or CSV (.csv), one record a line with "
                                    "prompt and response (or text) columns");
  finish();
}

DTRAIN_INLINE CausalLMData CausalLMData::from_records(const std::vector<std::pair<std::string, std::string>>& records,
                                                      const BpeTokenizer& tokenizer, CausalLMOptions options) {
  CausalLMData out(std::move(options), tokenizer.pad_id());
  const auto ends = detail::document_ends(tokenizer, "data::CausalLMData");
  if (records.empty()) throw DataError("data::CausalLMData::from_records: no records");
  for (std::size_t i = 0; i < records.size(); ++i) {
    const auto& [prompt, response] = records[i];
    const auto prompt_ids = prompt.empty() ? ends.begin : detail::concat(ends.begin, tokenizer.encode(prompt, false));
    out.add_document(prompt_ids, detail::concat(tokenizer.encode(response, false), {ends.eos}), "record " + std::to_string(i));
  }
  out.finish();
  return out;
}

DTRAIN_INLINE void CausalLMData::add_document(std::vector<std::int64_t> prompt, std::vector<std::int64_t> response,
                                              const std::string& where) {
  const auto max = options_.max_length;
  if (max < 2) throw DataError("data::CausalLMOptions: max_length is " + std::to_string(max) + "; a row needs at least 2 tokens");
  if (static_cast<std::int64_t>(prompt.size()) + 1 > max)
    throw DataError(where + ": the prompt is " + std::to_string(prompt.size()) + " tokens and max_length " + std::to_string(max) +
                    "; a document needs its prompt and at least one response token within max_length: shorten the "
                    "prompt or raise max_length (at most the model's context)");
  if (static_cast<std::int64_t>(prompt.size() + response.size()) > max) {
    response.resize(static_cast<std::size_t>(max) - prompt.size());
    ++truncated_;
  }
  Row doc;
  doc.ids = detail::concat(prompt, response);
  doc.labels = doc.ids;
  if (!options_.train_on_prompt) std::fill_n(doc.labels.begin(), prompt.size(), -100);
  doc.labels.front() = -100;  // nothing before a document predicts its first token
  for (std::size_t t = 0; t < doc.ids.size(); ++t) doc.positions.push_back(static_cast<std::int64_t>(t));
  label_tokens_ += std::count_if(doc.labels.begin() + 1, doc.labels.end(), [](std::int64_t l) { return l != -100; });
  ++documents_;
  pending_.push_back(std::move(doc));
}

DTRAIN_INLINE void CausalLMData::finish() {
  if (!options_.pack) {
    rows_ = std::move(pending_);
    return;
  }
  // Documents in order, whole, into rows of max_length; what a row has left is padding, its
  // positions counting from 0 as one more document that nothing sees.
  const auto max = static_cast<std::size_t>(options_.max_length);
  Row row;
  const auto flush = [&] {
    for (std::int64_t p = 0; row.ids.size() < max; ++p) {
      row.ids.push_back(pad_id_);
      row.labels.push_back(-100);
      row.positions.push_back(p);
    }
    rows_.push_back(std::move(row));
    row = {};
  };
  for (auto& doc : pending_) {
    if (row.ids.size() + doc.ids.size() > max) flush();
    row.ids.insert(row.ids.end(), doc.ids.begin(), doc.ids.end());
    row.labels.insert(row.labels.end(), doc.labels.begin(), doc.labels.end());
    row.positions.insert(row.positions.end(), doc.positions.begin(), doc.positions.end());
  }
  if (!row.ids.empty()) flush();
  pending_.clear();
}

DTRAIN_INLINE Fields CausalLMData::operator[](std::int64_t i) const {
  const auto& row = rows_.at(static_cast<std::size_t>(i));
  Fields out{{"input_ids", torch::tensor(row.ids, torch::kLong)}, {"labels", torch::tensor(row.labels, torch::kLong)}};
  if (options_.pack) out.set("position_ids", torch::tensor(row.positions, torch::kLong));
  return out;
}

DTRAIN_INLINE Fields CausalLMData::get_batch(const torch::Tensor& indices) const {
  const auto picked = indices.to(torch::kLong).contiguous();
  const auto* index = picked.data_ptr<std::int64_t>();
  const auto count = picked.numel();
  std::size_t longest = 0;
  for (std::int64_t r = 0; r < count; ++r) longest = std::max(longest, rows_.at(static_cast<std::size_t>(index[r])).ids.size());
  const auto width = static_cast<std::int64_t>(longest);
  auto ids = torch::full({count, width}, pad_id_, torch::kLong), labels = torch::full({count, width}, -100, torch::kLong);
  auto mask = torch::zeros({count, width}, torch::kLong), positions = torch::zeros({count, width}, torch::kLong);
  for (std::int64_t r = 0; r < count; ++r) {
    const auto& row = rows_[static_cast<std::size_t>(index[r])];
    const auto n = static_cast<std::int64_t>(row.ids.size());
    std::copy(row.ids.begin(), row.ids.end(), ids[r].data_ptr<std::int64_t>());
    std::copy(row.labels.begin(), row.labels.end(), labels[r].data_ptr<std::int64_t>());
    mask[r].narrow(0, 0, n).fill_(1);
    std::copy(row.positions.begin(), row.positions.end(), positions[r].data_ptr<std::int64_t>());
  }
  // Packed rows are all max_length and carry no mask: the positions say where documents start.
  if (options_.pack) return Fields{{"input_ids", ids}, {"labels", labels}, {"position_ids", positions}};
  return Fields{{"input_ids", ids}, {"labels", labels}, {"attention_mask", mask}};
}

}  // namespace data
DTRAIN_NAMESPACE_END
