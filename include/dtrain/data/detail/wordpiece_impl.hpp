// SPDX-License-Identifier: Apache-2.0
#pragma once
// data::WordPieceTokenizer's reading of tokenizer.json, post-processing (template, truncation,
// padding) and batch encoding. Included by dtrain/data/wordpiece.hpp; not on its own.

#include <algorithm>
#include <string>
#include <vector>

#include <dtrain/data/wordpiece.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace data {

template <class Range>
std::vector<WordPieceEncoding> WordPieceTokenizer::encode_batch(const Range& texts, unsigned threads) const {
  std::vector<std::string_view> views;
  for (const auto& t : texts) views.emplace_back(t);
  std::vector<WordPieceEncoding> out(views.size());
  detail::for_ranges_on_threads(views.size(), threads, [&](std::size_t from, std::size_t to) {
    for (auto i = from; i < to; ++i) out[i] = encoded(views[i], nullptr);
  });
  std::int64_t longest = 0;
  for (const auto& e : out) longest = std::max(longest, static_cast<std::int64_t>(e.input_ids.size()));
  for (auto& e : out) e = pad(std::move(e), longest);
  return out;
}

}  // namespace data

DTRAIN_NAMESPACE_END

#ifndef DTRAIN_SEPARATE_COMPILATION
#include <dtrain/data/detail/impl/wordpiece_impl.ipp>
#endif
