// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of assignment.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/strategy/assignment.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace strategy {

DTRAIN_INLINE std::vector<std::vector<std::size_t>> bucket_assignment(const std::vector<torch::Tensor>& params,
                                                                      std::int64_t first_bucket_bytes,
                                                                      std::int64_t bucket_bytes_cap) {
  std::vector<std::vector<std::size_t>> buckets;
  if (params.empty()) return buckets;
  buckets.emplace_back();
  std::int64_t cap = first_bucket_bytes, bytes = 0;
  torch::ScalarType dtype = params.back().scalar_type();
  for (std::size_t k = params.size(); k-- > 0;) {
    const auto& p = params[k];
    if (!buckets.back().empty() && (bytes >= cap || p.scalar_type() != dtype)) {
      buckets.emplace_back();
      bytes = 0;
      cap = bucket_bytes_cap;
    }
    dtype = p.scalar_type();
    buckets.back().push_back(k);
    bytes += p.numel() * static_cast<std::int64_t>(p.element_size());
  }
  return buckets;
}

DTRAIN_INLINE std::vector<std::vector<std::size_t>> unit_assignment(const std::vector<std::string>& names, wrap units) {
  std::vector<std::vector<std::size_t>> groups;
  std::map<std::string, std::size_t> group_of_child;
  for (std::size_t k = 0; k < names.size(); ++k) {
    std::size_t g = 0;
    if (units == wrap::top_level || units == wrap::layers) {
      const auto dot = names[k].find('.');
      std::string child = dot == std::string::npos ? std::string() : names[k].substr(0, dot);
      if (units == wrap::layers) {
        // The components before the parameter's own name: the first all-digit one ends the key.
        for (std::size_t begin = 0, end; (end = names[k].find('.', begin)) != std::string::npos; begin = end + 1)
          if (end > begin && std::all_of(names[k].begin() + static_cast<std::ptrdiff_t>(begin),
                                         names[k].begin() + static_cast<std::ptrdiff_t>(end),
                                         [](char c) { return c >= '0' && c <= '9'; })) {
            child = names[k].substr(0, end);
            break;
          }
      }
      auto [it, fresh] = group_of_child.try_emplace(child, groups.size());
      if (fresh) groups.emplace_back();
      g = it->second;
    } else if (groups.empty()) {
      groups.emplace_back();
    }
    groups[g].push_back(k);
  }
  return groups;
}

DTRAIN_INLINE flat_layout layout_of(const std::vector<std::int64_t>& numels, int world) {
  flat_layout l;
  for (auto n : numels) {
    l.offsets.push_back(l.numel);
    l.numel += n;
  }
  l.shard_numel = (l.numel + world - 1) / world;
  return l;
}
}  // namespace strategy
DTRAIN_NAMESPACE_END
