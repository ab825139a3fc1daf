// SPDX-License-Identifier: Apache-2.0
#pragma once
// The bodies of wordpiece_impl.hpp's functions (docs/packaging.md: header-only or compiled once).

#include <dtrain/data/detail/wordpiece_impl.hpp>

DTRAIN_NAMESPACE_BEGIN
namespace data {

DTRAIN_INLINE WordPieceTokenizer WordPieceTokenizer::from_json(nlohmann::json j, const std::string& origin) {
  using json = nlohmann::json;
  auto m = std::make_shared<detail::WordPieceModel>();
  m->origin = origin;
  const auto type_of = [](const json& o) { return o.is_object() && o.contains("type") ? o["type"].dump() : o.dump(); };
  try {
    if (!j.is_object()) m->fail("not a tokenizer.json (the top level is not an object)");
    // The model: WordPiece, its vocabulary and [UNK].
    const auto& model = j.contains("model") ? j["model"] : json();
    if (!model.is_object() || model.value("type", "") != "WordPiece")
      m->fail("the model is " + type_of(model).substr(0, 80) +
              ", not WordPiece; WordPieceTokenizer reads BERT-family tokenizers (BPE and Unigram models are not)");
    if (!model.contains("vocab") || !model["vocab"].is_object() || model["vocab"].empty())
      m->fail("model.vocab is missing or empty");
    const auto prefix = model.value("continuing_subword_prefix", std::string("##"));
    m->max_input_chars_per_word = model.value("max_input_chars_per_word", std::int64_t{100});
    for (const auto& [token, id_json] : model["vocab"].items()) {
      const auto id = id_json.get<std::int64_t>();
      m->vocab_size = std::max(m->vocab_size, id + 1);
      m->starts.intern(token);
      m->start_ids.push_back(id);
      m->longest_start = std::max(m->longest_start, token.size());
      if (!prefix.empty() && token.size() > prefix.size() && token.compare(0, prefix.size(), prefix) == 0) {
        m->continuations.intern(std::string_view(token).substr(prefix.size()));
        m->continuation_ids.push_back(id);
        m->longest_continuation = std::max(m->longest_continuation, token.size() - prefix.size());
      }
    }
    // A duplicate key would leave the id vectors longer than the tables: nlohmann keeps one.
    const auto unk = model.value("unk_token", std::string("[UNK]"));
    const auto unk_index = m->starts.find(unk);
    if (unk_index == detail::TokenTable::absent)
      m->fail("the unk_token " + unk + " is not in model.vocab (a word without pieces needs its id)");
    m->unk_id = m->start_ids[static_cast<std::size_t>(unk_index)];

    // Added tokens, matched in the raw text before anything else.
    for (const auto& a : j.value("added_tokens", json::array())) {
      const auto content = a.at("content").get<std::string>();
      if (a.value("normalized", false) || a.value("single_word", false) || a.value("lstrip", false) ||
          a.value("rstrip", false))
        m->fail("added token " + content +
                " is normalized, single_word, lstrip or rstrip; WordPieceTokenizer matches added tokens as typed only");
      if (content.empty()) continue;
      m->added.push_back({content, a.at("id").get<std::int64_t>()});
      m->vocab_size = std::max(m->vocab_size, m->added.back().id + 1);
      m->added_first_byte[static_cast<unsigned char>(content[0])] = true;
    }
    std::stable_sort(m->added.begin(), m->added.end(),
                     [](const auto& x, const auto& y) { return x.content.size() > y.content.size(); });

    // Normalizer and pre-tokenizer: BERT's, or none.
    const auto& norm = j.value("normalizer", json());
    if (!norm.is_null()) {
      if (norm.value("type", "") != "BertNormalizer")
        m->fail("normalizer " + type_of(norm) + " is not supported (BertNormalizer or null)");
      m->normalize = true;
      auto& n = m->normalizer;
      n.clean_text = norm.value("clean_text", true);
      n.handle_chinese_chars = norm.value("handle_chinese_chars", true);
      n.lowercase = norm.value("lowercase", true);
      const auto& strip = norm.contains("strip_accents") ? norm["strip_accents"] : json();
      n.strip_accents = strip.is_null() ? n.lowercase : strip.get<bool>();
    }
    const auto& pre = j.value("pre_tokenizer", json());
    if (!pre.is_null() && pre.value("type", "") != "BertPreTokenizer")
      m->fail("pre_tokenizer " + type_of(pre) + " is not supported (BertPreTokenizer or null)");
    m->pre_tokenize = !pre.is_null();

    // Post-processor: a template of special tokens around A (and B).
    const auto& post = j.value("post_processor", json());
    const auto piece = [&](bool seq, int which, std::vector<std::int64_t> ids, std::int64_t type) {
      return detail::WordPieceModel::Piece{seq, which, std::move(ids), type};
    };
    if (post.is_null()) {
      m->single = {piece(true, 0, {}, 0)};
      m->pair = {piece(true, 0, {}, 0), piece(true, 1, {}, 1)};
    } else if (post.value("type", "") == "BertProcessing") {
      const std::vector<std::int64_t> cls{post.at("cls").at(1).get<std::int64_t>()},
          sep{post.at("sep").at(1).get<std::int64_t>()};
      m->single = {piece(false, 0, cls, 0), piece(true, 0, {}, 0), piece(false, 0, sep, 0)};
      m->pair = {piece(false, 0, cls, 0), piece(true, 0, {}, 0), piece(false, 0, sep, 0), piece(true, 1, {}, 1),
                 piece(false, 0, sep, 1)};
    } else if (post.value("type", "") == "TemplateProcessing") {
      const auto read = [&](const json& t) {
        std::vector<detail::WordPieceModel::Piece> out;
        for (const auto& p : t) {
          if (p.contains("Sequence")) {
            const auto& s = p["Sequence"];
            out.push_back(piece(true, s.at("id").get<std::string>() == "B", {}, s.value("type_id", 0)));
          } else {
            const auto& s = p.at("SpecialToken");
            const auto name = s.at("id").get<std::string>();
            if (!post.at("special_tokens").contains(name))
              m->fail("post_processor's template names " + name + ", which its special_tokens lack");
            out.push_back(piece(false, 0, post["special_tokens"][name].at("ids").get<std::vector<std::int64_t>>(),
                                s.value("type_id", 0)));
          }
        }
        return out;
      };
      m->single = read(post.at("single"));
      m->pair = read(post.at("pair"));
    } else {
      m->fail("post_processor " + type_of(post) + " is not supported (TemplateProcessing, BertProcessing or null)");
    }

    // Truncation and padding.
    if (const auto& t = j.value("truncation", json()); !t.is_null()) {
      m->max_length = t.at("max_length").get<std::int64_t>();
      m->truncation_strategy = t.value("strategy", "LongestFirst");
      m->truncate_left = t.value("direction", "Right") == "Left";
      if (m->truncation_strategy != "LongestFirst" && m->truncation_strategy != "OnlyFirst" &&
          m->truncation_strategy != "OnlySecond")
        m->fail("truncation strategy " + m->truncation_strategy + " is unknown");
    }
    if (auto it = j.find("padding"); it != j.end() && !it->is_null()) {
      const auto& p = *it;
      m->padding = true;
      if (p.at("strategy").is_object()) m->pad_fixed = p["strategy"].at("Fixed").get<std::int64_t>();
      m->pad_left = p.value("direction", "Right") == "Left";
      m->pad_id = p.value("pad_id", std::int64_t{0});
      m->pad_type_id = p.value("pad_type_id", std::int64_t{0});
      if (p.contains("pad_to_multiple_of") && !p["pad_to_multiple_of"].is_null())
        m->pad_to_multiple_of = p["pad_to_multiple_of"].get<std::int64_t>();
    } else if (auto k = m->starts.find("[PAD]"); k != detail::TokenTable::absent) {
      m->pad_id = m->start_ids[static_cast<std::size_t>(k)];
    }
  } catch (const nlohmann::json::exception& e) {
    m->fail(std::string("unexpected content: ") + e.what());
  }
  m->source = std::move(j);
  WordPieceTokenizer t;
  t.model_ = std::move(m);
  return t;
}

DTRAIN_INLINE WordPieceEncoding WordPieceTokenizer::encoded(std::string_view a, const std::string_view* b) const {
  const auto& m = model();
  std::vector<std::int64_t> ids[2];
  m.sequence_ids(a, [&](std::int64_t id) { ids[0].push_back(id); });
  if (b) m.sequence_ids(*b, [&](std::int64_t id) { ids[1].push_back(id); });
  const auto& tpl = b ? m.pair : m.single;
  if (m.max_length) {
    std::size_t added = 0;
    for (const auto& p : tpl) added += p.ids.size();
    const auto room = static_cast<std::size_t>(std::max<std::int64_t>(0, *m.max_length - static_cast<std::int64_t>(added)));
    auto n1 = ids[0].size(), n2 = ids[1].size();
    if (n1 + n2 > room) {
      const auto remove = n1 + n2 - room;
      if (!b) {
        n1 = room;
      } else if (m.truncation_strategy == "LongestFirst") {  // tokenizers' truncate_encodings
        const bool swap = n1 > n2;
        if (swap) std::swap(n1, n2);
        n2 = n1 > room ? n1 : std::max(n1, room - n1);
        if (n1 + n2 > room) {
          n1 = room / 2;
          n2 = n1 + room % 2;
        }
        if (swap) std::swap(n1, n2);
      } else {
        auto& n = m.truncation_strategy == "OnlyFirst" ? n1 : n2;
        if (n <= remove)
          throw DataError("WordPieceTokenizer: truncation " + m.truncation_strategy + " cannot fit the pair into " +
                          std::to_string(*m.max_length) + " ids: the sequence to truncate is too short");
        n -= remove;
      }
      for (int k = 0; k < 2; ++k) {
        const auto keep = k == 0 ? n1 : n2;
        auto& v = ids[k];
        if (v.size() <= keep) continue;
        if (m.truncate_left) v.erase(v.begin(), v.end() - static_cast<std::ptrdiff_t>(keep));
        else v.resize(keep);
      }
    }
  }
  WordPieceEncoding e;
  for (const auto& p : tpl) {
    const auto& from = p.sequence ? ids[p.which] : p.ids;
    e.input_ids.insert(e.input_ids.end(), from.begin(), from.end());
    e.token_type_ids.insert(e.token_type_ids.end(), from.size(), p.type_id);
  }
  e.attention_mask.assign(e.input_ids.size(), 1);
  return e;
}

DTRAIN_INLINE WordPieceEncoding WordPieceTokenizer::pad(WordPieceEncoding e, std::int64_t to) const {
  const auto& m = model();
  if (!m.padding) return e;
  auto target = m.pad_fixed.value_or(std::max<std::int64_t>(to, static_cast<std::int64_t>(e.input_ids.size())));
  if (m.pad_to_multiple_of > 0 && target % m.pad_to_multiple_of != 0)
    target += m.pad_to_multiple_of - target % m.pad_to_multiple_of;
  const auto have = static_cast<std::int64_t>(e.input_ids.size());
  if (have >= target) return e;
  const auto n = static_cast<std::size_t>(target - have);
  const auto fill = [&](std::vector<std::int64_t>& v, std::int64_t x) {
    v.insert(m.pad_left ? v.begin() : v.end(), n, x);
  };
  fill(e.input_ids, m.pad_id);
  fill(e.attention_mask, 0);
  fill(e.token_type_ids, m.pad_type_id);
  return e;
}
}  // namespace data
DTRAIN_NAMESPACE_END
