// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of safetensors_index.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/weights/safetensors_index.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace weights {

DTRAIN_INLINE std::vector<std::filesystem::path> SafetensorsIndex::shards() const {
  std::map<std::string, bool> names;
  for (const auto& [tensor, shard] : weight_map) names[shard] = true;
  std::vector<std::filesystem::path> out;
  for (const auto& [name, _] : names) out.push_back(path.parent_path() / name);
  return out;
}

DTRAIN_INLINE SafetensorsIndex read_safetensors_index(const std::filesystem::path& path) {
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

DTRAIN_INLINE std::vector<std::pair<std::string, torch::Tensor>> read_sharded_safetensors(const std::filesystem::path& path) {
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
