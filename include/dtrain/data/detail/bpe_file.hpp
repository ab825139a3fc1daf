// SPDX-License-Identifier: Apache-2.0
#pragma once
// Reading a tokenizer.json's BPE model into a BpeModel, as tokenizers reads it: the vocabulary and
// merges, the added tokens and their ids, truncation and padding, and the special tokens' ids
// (with transformers' names from tokenizer_config.json); the stages around the model are
// bpe_stages.hpp's. Included by dtrain/data/bpe_tokenizer.hpp.

#include <filesystem>
#include <optional>
#include <string>

#include <dtrain/data/detail/bpe_stages.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace data::detail::bpe {

/// model.vocab, model.merges and the model's options. The pre-tokenizer is read first: whether
/// words are bytes decides how the vocabulary is kept.
void read_model(BpeModel& m, const json& model);
/// added_tokens, with the ids tokenizers gives them.
void read_added_tokens(BpeModel& m, const json& j);
void read_truncation_padding(BpeModel& m, const json& j);
/// bos_id, eos_id and pad_id: transformers' `names` (bos_token, eos_token, pad_token) first.
void read_special_ids(BpeModel& m, const json& names);
/// The name of a special token in transformers' tokenizer_config.json: a string or {"content": ...}.
std::optional<std::string> config_token(const json& config, const char* key);
/// The JSON in `path`: DataError when it cannot be read or is not JSON.
json parse_file(const std::filesystem::path& path);

}  // namespace data::detail::bpe

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/data/detail/impl/bpe_file.ipp>
#endif
