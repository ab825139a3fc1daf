// SPDX-License-Identifier: Apache-2.0
#pragma once
// Reading the stages of a tokenizer.json around its BPE model into a BpeModel, as tokenizers reads
// them: normalizer, pre-tokenizer, post-processor and decoder. A part that BpeTokenizer cannot
// reproduce is a DataError naming the file and the part (BpeModel::fail). Included by
// dtrain/data/detail/bpe_file.hpp.

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <dtrain/data/detail/bpe_model.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace data::detail::bpe {

using json = nlohmann::json;

/// `o`'s "type" (or `o` itself), as JSON, cut at 80 characters: what a message names.
std::string type_of(const json& o);
/// A Sequence's parts (tokenizers nests them under `key`), flattened into `out`.
void flatten(const json& o, const char* key, std::vector<const json*>& out);
/// o[key] as a string, or nothing when it is missing or null.
std::optional<std::string> optional_string(const json& o, const char* key);

/// A Split step: the three patterns BpeTokenizer has scanners for by them, any other by PCRE2.
Splitter read_split(const BpeModel& m, const json& p);
void read_pre_tokenizer(BpeModel& m, const json& j);
void read_normalizer(BpeModel& m, const json& j);
void read_post_processor(BpeModel& m, const json& j);
void read_decoder(BpeModel& m, const json& j);

}  // namespace data::detail::bpe

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/data/detail/impl/bpe_stages.ipp>
#endif
