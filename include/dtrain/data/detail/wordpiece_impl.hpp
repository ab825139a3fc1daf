// SPDX-License-Identifier: Apache-2.0
#pragma once
// data::WordPieceTokenizer's reading of tokenizer.json, post-processing (template, truncation,
// padding) and batch encoding. Included by dtrain/data/wordpiece.hpp; not on its own.

#include <algorithm>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include <dtrain/data/wordpiece.hpp>

DTRAIN_NAMESPACE_BEGIN

namespace data {

template <class Range>
std::vector<WordPieceEncoding> WordPieceTokenizer::encode_batch(const Range& texts, unsigned threads) const {
  std::vector<std::string_view> views;
  for (const auto& t : texts) views.emplace_back(t);
  std::vector<WordPieceEncoding> out(views.size());
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  // Below a few hundred texts a thread costs more than it saves.
  threads = static_cast<unsigned>(std::min<std::size_t>(threads, std::max<std::size_t>(1, views.size() / 256)));
  const auto run = [&](std::size_t from, std::size_t to) {
    for (auto i = from; i < to; ++i) out[i] = encoded(views[i], nullptr);
  };
  if (threads <= 1) {
    run(0, views.size());
  } else {
    std::vector<std::thread> pool;
    std::vector<std::exception_ptr> errors(threads);
    const auto per = (views.size() + threads - 1) / threads;
    for (unsigned k = 0; k < threads; ++k)
      pool.emplace_back([&, k] {
        try {
          run(std::min(views.size(), k * per), std::min(views.size(), (k + 1) * per));
        } catch (...) {
          errors[k] = std::current_exception();
        }
      });
    for (auto& t : pool) t.join();
    for (auto& e : errors)
      if (e) std::rethrow_exception(e);
  }
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
