// SPDX-License-Identifier: Apache-2.0
#pragma once
// A sharded safetensors checkpoint: `model.safetensors.index.json` (Hugging Face's
// save_pretrained(max_shard_size=...)) maps each tensor to the shard file that holds it,
//   {"metadata": {"total_size": ...}, "weight_map": {"embeddings.word_embeddings.weight":
//    "model-00001-of-00002.safetensors", ...}}
// and the shards lie beside it. A shard is named by its file name alone: a path (a "/", "..") in
// the index is refused, so an index cannot make dtrain read files outside its directory.

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/types.h>

#include <dtrain/error.hpp>
#include <dtrain/weights/safetensors_reader.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace weights {

/// A sharded checkpoint's index: tensor name -> shard file name, shards beside the index.
struct SafetensorsIndex {
  std::filesystem::path path;
  std::map<std::string, std::string> weight_map;
  /// The shards' paths, each once, in the order of their names.
  std::vector<std::filesystem::path> shards() const;
};

/// Reads and checks the index at `path` (its shards are not opened).
SafetensorsIndex read_safetensors_index(const std::filesystem::path& path);

/// Every tensor the index at `path` names, by name (the weight_map's order), each read from its
/// shard without a copy. Throws Error naming the shard and the tensor when a shard lacks a tensor
/// the index places in it; a shard's tensors the index does not name are not read.
std::vector<std::pair<std::string, torch::Tensor>> read_sharded_safetensors(const std::filesystem::path& path);

}  // namespace weights

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/weights/impl/safetensors_index.ipp>
#endif
