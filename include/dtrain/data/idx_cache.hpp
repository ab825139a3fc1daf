// SPDX-License-Identifier: Apache-2.0
#pragma once
// A cache of decompressed IDX files, mapped read-only: a later run (and every process that maps
// it) reads the bytes from the page cache instead of inflating the gzip file again.
//
// The cache file is the decompressed IDX file as it is, named after the source's path, size and
// modification time (a changed source gets a new name, and the old one is removed), written under
// a temporary name and renamed into place, so that a reader sees a complete file or none. It is checked like the source
// (magic, dimensions, length) each time it is mapped; one that fails is rebuilt.

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include <torch/types.h>

#include <dtrain/data/idx.hpp>
#include <dtrain/error.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace data {

/// Where decompressed datasets are cached: $DTRAIN_CACHE_DIR, else $XDG_CACHE_HOME/dtrain, else
/// $HOME/.cache/dtrain; empty (no cache) when DTRAIN_CACHE_DIR is set to "" or none of them is set.
std::filesystem::path default_cache_directory();

namespace detail {

/// FNV-1a of `text` as 16 hex digits: stable across builds and runs, unlike std::hash.
std::string fnv1a_hex(const std::string& text);

/// The prefix of every cache file of `source` (its stem, a hash of its absolute path).
std::string idx_cache_prefix(const std::filesystem::path& source);

/// The cache file's name for `source`: the prefix and a hash of its size and modification time.
/// Empty when `source` cannot be stat'ed (the read that follows says why).
std::string idx_cache_name(const std::filesystem::path& source);

/// Removes the cache files of earlier versions of the source `cached` caches (same prefix).
void remove_stale_idx_caches(const std::filesystem::path& cached, const std::string& prefix);

/// The IDX file at `cached`, mapped read-only as a uint8 tensor of its dimensions (the mapping
/// lives as long as the tensor and its views); nothing when it is missing or fails the checks.
std::optional<torch::Tensor> map_idx_file(const std::filesystem::path& cached, int expected_dims);

/// Writes `bytes` to `cached` atomically (a temporary name, then rename); false, with `why`, when
/// it cannot.
bool write_idx_cache(const std::filesystem::path& cached, const std::vector<std::uint8_t>& bytes,
                     std::string& why);

/// read_idx_ubyte(source, expected_dims) through the cache under `cache_dir` (none when empty):
/// the mapped cache file when there is a valid one; else the source decompressed, checked and
/// written to the cache for the next run. A cache that cannot be written costs a warning, not the
/// run. The errors for a bad source are read_idx_ubyte's.
torch::Tensor read_idx_ubyte_cached(const std::filesystem::path& source, int expected_dims,
                                    const std::filesystem::path& cache_dir);

}  // namespace detail

}  // namespace data

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/data/impl/idx_cache.ipp>
#endif
