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
  std::vector<std::filesystem::path> shards() const {
    std::map<std::string, bool> names;
    for (const auto& [tensor, shard] : weight_map) names[shard] = true;
    std::vector<std::filesystem::path> out;
    for (const auto& [name, _] : names) out.push_back(path.parent_path() / name);
    return out;
  }
};

/// Reads and checks the index at `path` (its shards are not opened).
inline SafetensorsIndex read_safetensors_index(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) throw Error(path.string() + ": cannot open the sharded safetensors index (no such file?)");
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception& e) {
    throw Error(path.string() + ": not a sharded safetensors index (not JSON: " + e.what() + ")");
  }
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    throw Error(path.string() + ": not a sharded safetensors index (no \"weight_map\" object); "
                "save_pretrained writes one as model.safetensors.index.json");
  SafetensorsIndex index{path, {}};
  for (const auto& [tensor, shard] : j["weight_map"].items()) {
    if (!shard.is_string())
      throw Error(path.string() + ": tensor \"" + tensor + "\" maps to " + shard.dump() + ", not a shard file name");
    const auto name = shard.get<std::string>();
    if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos)
      throw Error(path.string() + ": tensor \"" + tensor + "\" maps to \"" + name +
                  "\", which is not a file name beside the index; shards must lie in the index's directory");
    index.weight_map.emplace(tensor, name);
  }
  return index;
}

/// Every tensor the index at `path` names, by name (the weight_map's order), each read from its
/// shard without a copy. Throws Error naming the shard and the tensor when a shard lacks a tensor
/// the index places in it; a shard's tensors the index does not name are not read.
inline std::vector<std::pair<std::string, torch::Tensor>> read_sharded_safetensors(const std::filesystem::path& path) {
  const auto index = read_safetensors_index(path);
  std::map<std::string, SafetensorsFile> shards;
  for (const auto& shard : index.shards()) shards.emplace(shard.filename().string(), SafetensorsFile(shard));
  std::vector<std::pair<std::string, torch::Tensor>> out;
  out.reserve(index.weight_map.size());
  for (const auto& [tensor, shard] : index.weight_map) {
    const auto& file = shards.at(shard);
    if (!file.find(tensor))
      throw Error(file.path().string() + ": has no tensor \"" + tensor + "\", which the index " + path.string() +
                  " places in it; are the shards from another save?");
    out.emplace_back(tensor, file.tensor(tensor));
  }
  return out;
}

}  // namespace weights

DTRAIN_NAMESPACE_END
