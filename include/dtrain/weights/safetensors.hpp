// SPDX-License-Identifier: Apache-2.0
#pragma once
// Safetensors, Hugging Face's weight format, read and written.
//
//   dtrain::weights::SafetensorsFile file("model.safetensors");
//   file.metadata();                            // "__metadata__": string -> string
//   for (const auto& t : file.tensors()) ...    // name, dtype ("F32", "BF16", ...), shape, offsets
//   torch::Tensor w = file.tensor("embeddings.word_embeddings.weight");
//   dtrain::weights::save_safetensors("out.safetensors", {{"w", w}}, {{"format", "pt"}});
//
// The format: an 8-byte little-endian header length N; N bytes of JSON, {name: {"dtype", "shape",
// "data_offsets": [begin, end]}, "__metadata__": {string: string}}; then the data region, every
// tensor's row-major little-endian bytes at [begin, end) of the region.
//
// Reading maps the file (weights/detail/mapped_file.hpp) and validates the whole header before a
// byte of data is touched, as upstream's reader does: the header at most 100 MB and inside the
// file, JSON with no duplicate names, known dtypes, shapes whose byte size equals their offsets'
// span, and tensors that tile the data region exactly (no gap, no overlap, nothing past the end).
// Every refusal is an Error naming the file, the tensor where there is one, and what to do.
//
// No copy: tensor() makes a torch::from_blob tensor over the mapping whose deleter holds a
// shared_ptr to it, so the file stays mapped while any of its tensors lives; call .clone() for a
// tensor of your own. Writing into such a tensor is allowed and copies that page only (the mapping
// is private): the file never changes. One exception copies at once: a tensor whose bytes are not
// aligned to its element size (safetensors' own writer aligns them; other writers may not). Dtypes
// the LibTorch built against has no type for (U16, U32, U64 and F8 before 2.1 to 2.8, F6 and F4 on
// every version: compat::added_scalar_type) are read in the header but tensor() refuses them,
// naming file, tensor and dtype; a BOOL tensor holding a byte other than 0 or 1 is refused too.
//
// Writing (save_safetensors) sorts tensors by element size, largest first, then by name (upstream's
// order: every tensor aligned in a region that starts at a multiple of 8), pads the header with
// spaces to a multiple of 8, and writes a temporary file that is fsynced and renamed into place.
//
// A sharded checkpoint (model.safetensors.index.json and its shards): safetensors_index.hpp.

#include <dtrain/weights/safetensors_index.hpp>
#include <dtrain/weights/safetensors_reader.hpp>
#include <dtrain/weights/safetensors_writer.hpp>
