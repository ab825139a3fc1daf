// SPDX-License-Identifier: Apache-2.0
#pragma once
// Pretrained weights loaded into a C++ module by name: a safetensors file, a sharded safetensors
// checkpoint, a Hugging Face model directory, or a state_dict saved by Python's
// `torch.save(model.state_dict(), path)`.
//
//   auto report = dtrain::weights::load(*model, "model.safetensors");                       // strict
//   auto report = dtrain::weights::load(*model, hf_dir, {.strict = false, .prefix = "bert."});
//   for (const auto& k : report.missing) ...   // the module's names the file did not have
//
// What `path` is decides how it is read (read()): a directory is a Hugging Face model directory
// (model.safetensors, else model.safetensors.index.json, else pytorch_model.bin inside); a file
// ending in .safetensors is safetensors, one ending in .json a sharded index; a zip file (or one
// ending in .pt, .pth, .bin) a torch.save pickle; any other file is read as safetensors.
//
// Names are the module's named_parameters() and named_buffers() (torch::nn's registered names, as
// PyTorch's). Prefixes (LoadOptions::prefix): by default a `module.` prefix on every key (a
// state_dict saved from a DistributedDataParallel wrapper) is removed. A named prefix ("bert.",
// "vit.") is removed from the keys that have it, to load the backbone of a task checkpoint into the
// bare model; the keys without it (the task's head) are unexpected, so such a load is non-strict, or
// strict only when every key has the prefix. A named prefix no key has is an Error.
//
// Shapes must match: a mismatch throws Error naming the key and both shapes, in strict and
// non-strict mode alike (as PyTorch refuses a shape mismatch either way). Floating-point tensors
// are converted to the parameter's floating-point dtype as PyTorch's load_state_dict does (copy_:
// an fp16 or bf16 checkpoint loads into an fp32 model; an fp64 one is rounded); any other dtype
// mismatch (an integer tensor for a float parameter) throws Error naming the key and both dtypes.

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/types.h>

#include <dtrain/detail/torch_pickle.hpp>
#include <dtrain/error.hpp>
#include <dtrain/weights/safetensors.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace weights {

struct LoadOptions {
  /// Strict: every name of the module is in the file and every tensor of the file is in the
  /// module, else Error listing both sets (and nothing is copied). Non-strict: the names in both
  /// are loaded, and the report lists the others. Either way a file of which no tensor has a name
  /// of the module is an Error (a model that would train from its random initialisation), which
  /// names the prefix that would make the names match when there is one.
  bool strict = true;
  /// Removed from the file's keys before they are matched: "" removes `module.` when every key has
  /// it; a named prefix ("bert.") is removed from the keys that have it (see the header's comment).
  std::string prefix = "";
};

/// What a load did not match: names of the module absent from the file, and keys of the file
/// (after the prefix was removed) absent from the module.
struct LoadReport {
  std::vector<std::string> missing, unexpected;
  /// Keys of the file whose value is not a tensor (an `_extra_state`, say): never loaded.
  std::vector<std::string> not_tensors;
  std::size_t loaded = 0;
  bool complete() const { return missing.empty() && unexpected.empty(); }
};

/// The names in `names` as "a", "b", ... (at most `limit`, then how many more).
std::string list_names(const std::vector<std::string>& names, std::size_t limit = 20);

/// Copies `state` (name -> tensor, as read from a state_dict) into `module`'s parameters and
/// buffers by name; `source` names the state in errors. See the header's comment for the rules.
LoadReport load_state_dict(torch::nn::Module& module, std::vector<std::pair<std::string, torch::Tensor>> state,
                           const std::string& source, LoadOptions options = {});

/// Reads the state_dict Python saved at `path` (torch.save, zip format) and loads it into `module`
/// (load_state_dict). Throws Error naming the file when it is not such a file.
LoadReport load_python_state_dict(torch::nn::Module& module, const std::filesystem::path& path,
                                  LoadOptions options = {});

/// The tensors of the state_dict Python saved at `path`, by key, in the file's order.
inline std::vector<std::pair<std::string, torch::Tensor>> read_python_state_dict(const std::filesystem::path& path) {
  return dtrain::detail::torch_pickle::read_tensor_dict(path);
}

namespace detail {

/// How read() takes `path`, with the file it reads (a directory's model file).
enum class WeightsFormat { safetensors, sharded_index, torch_pickle };

std::pair<WeightsFormat, std::filesystem::path> weights_format(const std::filesystem::path& path);

/// What to do about a load whose names do not match: the prefix that makes most of them match,
/// when there is one, else `otherwise`.
std::string prefix_hint(const std::vector<std::string>& missing, const std::vector<std::string>& unexpected,
                        const std::string& otherwise);

}  // namespace detail

/// The tensors at `path`, by key: a safetensors file, a sharded index, a Hugging Face model
/// directory or a torch.save state_dict (see the header's comment). `not_tensors`, when given,
/// receives a pickle's keys whose values are not tensors.
std::vector<std::pair<std::string, torch::Tensor>> read(const std::filesystem::path& path,
                                                        std::vector<std::string>* not_tensors = nullptr);

/// Reads the weights at `path` (read()) and loads them into `module` (load_state_dict); errors
/// name the file read.
LoadReport load(torch::nn::Module& module, const std::filesystem::path& path, LoadOptions options = {});

}  // namespace weights

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/impl/weights.ipp>
#endif
