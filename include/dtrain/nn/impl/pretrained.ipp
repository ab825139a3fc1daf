// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of pretrained.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/nn/pretrained.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace nn {
namespace detail {

DTRAIN_INLINE void write_pretrained(const torch::nn::Module& module, const std::filesystem::path& dir, nlohmann::json config,
                                    const std::string& architecture, const SavePretrainedOptions& options) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error(dir.string() + ": cannot create the directory (" + ec.message() + ")");

  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (const auto& p : module.named_parameters(true)) {
    if (p.key().find(".lora_A.") != std::string::npos)
      throw Error("nn::save_pretrained(" + dir.string() + "): the model has LoRA adapters (" + p.key() +
                  "), which transformers would not load; nn::merge_lora folds them into the base weights first, "
                  "or nn::save_peft_adapter writes them as a PEFT adapter");
    if (p.value().numel() == 0)
      throw Error("nn::save_pretrained(" + dir.string() + "): the parameter \"" + p.key() +
                  "\" holds no values (a model sharded by fsdp<>?); export the model a checkpoint restores "
                  "(checkpointer::build_model and Checkpoint::load_model)");
    tensors.emplace_back(p.key(), p.value());
  }
  for (const auto& b : module.named_buffers(true)) tensors.emplace_back(b.key(), b.value());
  weights::save_safetensors(dir / "model.safetensors", tensors, {{"format", "pt"}});

  config["architectures"] = {architecture};
  // transformers' name of the weights' dtype (the first tensor's: the model is one dtype).
  const auto dtype = tensors.empty() ? torch::kFloat : tensors.front().second.scalar_type();
  config["dtype"] = dtype == torch::kBFloat16 ? "bfloat16"
                    : dtype == torch::kHalf   ? "float16"
                    : dtype == torch::kDouble ? "float64"
                                              : "float32";
  {
    std::ofstream out(dir / "config.json");
    out << config.dump(2) << '\n';
    if (!out) throw Error((dir / "config.json").string() + ": cannot be written");
  }
  for (const auto& file : options.files) {
    const auto name = file.filename();
    if (name == "config.json" || name.string().rfind("model.safetensors", 0) == 0)
      throw Error("nn::save_pretrained: " + file.string() + " would replace the " + name.string() +
                  " save_pretrained writes; leave it out of SavePretrainedOptions::files");
    fs::copy_file(file, dir / name, fs::copy_options::overwrite_existing, ec);
    if (ec) throw Error("nn::save_pretrained: cannot copy " + file.string() + " into " + dir.string() + " (" + ec.message() + ")");
  }
}
}  // namespace detail
}  // namespace nn
DTRAIN_NAMESPACE_END
