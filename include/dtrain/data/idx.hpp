// SPDX-License-Identifier: Apache-2.0
#pragma once
// Reading gzipped IDX files (the format of MNIST and Fashion-MNIST) into tensors.

#include <zlib.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <limits>
#include <cstdint>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include <torch/types.h>

#include <dtrain/error.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace data::detail {

/// The whole decompressed content of a gzip file (a plain file is returned as it is, as zlib does).
std::vector<std::uint8_t> read_gzip(const std::filesystem::path& path);

/// The dimensions of the IDX file of unsigned bytes in `raw` (`size` bytes, decompressed), checked
/// against `expected_dims` and the payload's length; `header` gets the payload's offset. `path`
/// names the file in the errors.
std::vector<std::int64_t> parse_idx_ubyte(const std::uint8_t* raw, std::size_t size,
                                          const std::filesystem::path& path, int expected_dims,
                                          std::size_t& header);

/// An IDX file of unsigned bytes: its dimensions and payload as a uint8 tensor of those dimensions.
/// `expected_dims` is the number of dimensions the caller needs (3 for images, 1 for labels).
torch::Tensor read_idx_ubyte(const std::filesystem::path& path, int expected_dims);

}  // namespace data::detail

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/data/impl/idx.ipp>
#endif
