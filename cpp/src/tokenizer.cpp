// Tokenizer: source text to ids and target ids to text, as twostep/runtime/tokenizer.py does. Special pieces are
// split out of the text first; SentencePiece splits the rest, and the artifact's vocab tables, where it has them,
// turn pieces into ids and back (a pretrained model's ids are its own, not its SentencePiece model's).
#include <sentencepiece_processor.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <unordered_map>
#include <unordered_set>

#include "twostep/twostep.h"

namespace twostep {
namespace fs = std::filesystem;

namespace {
const std::string kWordBoundary = "\xe2\x96\x81";  // U+2581, SentencePiece's "▁"

// The characters Python's str.strip() takes off (str.isspace()), UTF-8 encoded: decoded text is trimmed as
// the Python runtime trims it.
const char* const kPythonSpaces[] = {
    " ", "\t", "\n", "\v", "\f", "\r", "\x1c", "\x1d", "\x1e", "\x1f",
    "\xc2\x85", "\xc2\xa0", "\xe1\x9a\x80",                                              // U+0085 U+00A0 U+1680
    "\xe2\x80\x80", "\xe2\x80\x81", "\xe2\x80\x82", "\xe2\x80\x83", "\xe2\x80\x84", "\xe2\x80\x85",  // U+2000..
    "\xe2\x80\x86", "\xe2\x80\x87", "\xe2\x80\x88", "\xe2\x80\x89", "\xe2\x80\x8a",              // ..U+200A
    "\xe2\x80\xa8", "\xe2\x80\xa9", "\xe2\x80\xaf", "\xe2\x81\x9f", "\xe3\x80\x80",  // U+2028 2029 202F 205F 3000
};

// The byte length of the whitespace character text[begin, end) starts with (from_end: ends with), 0 when none.
size_t space_length(const std::string& text, size_t begin, size_t end, bool from_end) {
  for (const char* space : kPythonSpaces) {
    const size_t n = std::char_traits<char>::length(space);
    if (n <= end - begin && text.compare(from_end ? end - n : begin, n, space) == 0) return n;
  }
  return 0;
}

std::string python_strip(const std::string& text) {
  size_t begin = 0, end = text.size();
  while (size_t n = space_length(text, begin, end, false)) begin += n;
  while (size_t n = space_length(text, begin, end, true)) end -= n;
  return text.substr(begin, end - begin);
}

void replace_all(std::string& text, const std::string& from, const std::string& to) {
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size()))
    text.replace(at, from.size(), to);
}

bool blank(const std::string& text) { return python_strip(text).empty(); }

void load_model(sentencepiece::SentencePieceProcessor& sp, const fs::path& file) {
  if (auto status = sp.Load(file.string()); !status.ok())
    throw Error(file.string() + ": not a SentencePiece model (" + status.ToString() + ")");
}

// A {piece: id} JSON file, in the file's order (inverting it keeps the last piece of an id, as a Python dict does).
std::vector<std::pair<std::string, int64_t>> read_vocab(const fs::path& file) {
  std::ifstream in(file);
  if (!in) throw Error(file.string() + ": cannot read");
  nlohmann::ordered_json table;
  try {
    table = nlohmann::ordered_json::parse(in);
  } catch (const nlohmann::ordered_json::parse_error& e) {
    throw Error(file.string() + ": not valid JSON (" + e.what() + ")");
  }
  if (!table.is_object()) throw Error(file.string() + ": expected a JSON object {piece: id}");
  std::vector<std::pair<std::string, int64_t>> out;
  for (const auto& [piece, id] : table.items()) {
    if (!id.is_number_integer())
      throw Error(file.string() + ": the id of piece '" + piece + "' is " + id.dump() + ", expected an integer");
    out.emplace_back(piece, id.get<int64_t>());
  }
  return out;
}

void append(Ids& to, const Ids& ids) { to.insert(to.end(), ids.begin(), ids.end()); }
}  // namespace

struct Tokenizer::Impl {
  TokenizerSpec spec;
  Languages languages;
  sentencepiece::SentencePieceProcessor source, target;
  std::optional<std::unordered_map<std::string, int64_t>> source_ids;   // source_vocab; none: source's own ids
  std::optional<std::unordered_map<int64_t, std::string>> target_pieces;  // target_vocab inverted; none: target's
  std::optional<std::unordered_map<int64_t, std::string>> source_pieces;  // source_vocab inverted; none: source's
  std::vector<std::pair<std::string, int64_t>> specials;  // special pieces and their ids, longest first
  std::unordered_set<int64_t> drop;

  // A source piece's id: the table's, or unk_id where it has none; without a table, SentencePiece's.
  int64_t piece_id(const std::string& piece) const {
    if (!source_ids) return source.PieceToId(piece);
    const auto it = source_ids->find(piece);
    return it == source_ids->end() ? spec.unk_id : it->second;
  }

  // The longest special piece at text[at...], or null.
  const std::pair<std::string, int64_t>* special_at(const std::string& text, size_t at) const {
    for (const auto& special : specials)
      if (text.compare(at, special.first.size(), special.first) == 0) return &special;
    return nullptr;
  }

  // One stretch of text without special pieces, through SentencePiece; spec.trailing_space after it where it
  // ends in whitespace (twostep/runtime/tokenizer.py's WHITESPACE). `surfaces`, if given: each id's piece.
  void append_chunk(const std::string& chunk, Ids& out, std::vector<std::string>* surfaces) const {
    if (chunk.empty()) return;
    std::vector<std::string> pieces;
    if (source_ids || surfaces) {
      if (auto status = source.Encode(chunk, &pieces); !status.ok()) throw Error("tokenizer: " + status.ToString());
    }
    if (!source_ids) {
      std::vector<int> ids;
      if (auto status = source.Encode(chunk, &ids); !status.ok()) throw Error("tokenizer: " + status.ToString());
      out.insert(out.end(), ids.begin(), ids.end());
    } else {
      for (const std::string& piece : pieces) out.push_back(piece_id(piece));
    }
    if (surfaces) surfaces->insert(surfaces->end(), pieces.begin(), pieces.end());
    if (std::string(" \t\n\r\f\v").find(chunk.back()) != std::string::npos) {
      out.insert(out.end(), spec.trailing_space.begin(), spec.trailing_space.end());
      if (surfaces) surfaces->insert(surfaces->end(), spec.trailing_space.size(), kWordBoundary);
    }
  }

  // The source language's ids, then the target language's source ids (the defaults where none is given).
  Ids language_ids(const std::string& src_lang, const std::string& tgt_lang) const {
    const std::string src = languages.source_code(src_lang), tgt = languages.target_code(tgt_lang);
    Ids out;
    if (!src.empty()) append(out, languages.source.at(src));
    if (!tgt.empty()) append(out, languages.target.at(tgt).source);
    return out;
  }

  // Special pieces wherever they are in the text (the longest where several start at one place), each its
  // own id; SentencePiece for the stretches between them.
  Ids pieces(const std::string& text, std::vector<std::string>* surfaces = nullptr) const {
    Ids out;
    size_t chunk = 0;  // where the text not yet tokenized starts
    for (size_t at = 0; at < text.size();) {
      const auto* special = special_at(text, at);
      if (!special) {
        ++at;
        continue;
      }
      append_chunk(text.substr(chunk, at - chunk), out, surfaces);
      out.push_back(special->second);
      if (surfaces) surfaces->push_back(special->first);
      at += special->first.size();
      chunk = at;
    }
    append_chunk(text.substr(chunk), out, surfaces);
    return out;
  }

  // prefix, the text's pieces, the suffix; `surfaces`, if given: the piece each id is ("" for prefix and suffix).
  Ids sentence(const Ids& prefix, const std::string& text, std::vector<std::string>* surfaces = nullptr) const {
    Ids ids = prefix;
    if (surfaces) surfaces->assign(prefix.size(), "");
    append(ids, pieces(text, surfaces));
    append(ids, spec.source_suffix);
    if (surfaces) surfaces->resize(ids.size());
    return ids;
  }

  // The piece of a target id; none for an id without one (not in the target table, outside the target model).
  std::optional<std::string> target_piece(int64_t id) const {
    if (target_pieces) {
      if (const auto it = target_pieces->find(id); it != target_pieces->end()) return it->second;
    } else if (id >= 0 && id < target.GetPieceSize()) {
      return target.IdToPiece(static_cast<int>(id));
    }
    return std::nullopt;
  }

  // The pieces of the ids that are not dropped; ids without a piece (not in the target table, outside the
  // target SentencePiece model) are left out too.
  std::vector<std::string> target_pieces_of(const Ids& ids) const {
    std::vector<std::string> out;
    for (int64_t id : ids)
      if (!drop.count(id))
        if (auto piece = target_piece(id)) out.push_back(std::move(*piece));
    return out;
  }

  // Target pieces as text, as spec.detokenize says.
  std::string join(const std::vector<std::string>& pieces) const {
    std::string text;
    if (auto status = target.Decode(pieces, &text); !status.ok()) throw Error("tokenizer: " + status.ToString());
    replace_all(text, kWordBoundary, " ");  // pieces the target model does not know come back as they are
    if (spec.detokenize == "argos") {  // argostranslate's SentencePieceTokenizer.decode, then its lstrip of one
      replace_all(text, "_", " ");
      return text.rfind(' ', 0) == 0 ? text.substr(1) : text;
    }
    return python_strip(text);
  }
};

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::load(const Manifest& manifest) {
  if (!manifest.tokenizer)
    throw Error("this model has no tokenizer: text translation needs one (token-id APIs work without)");
  auto impl = std::make_unique<Impl>();
  Impl& x = *impl;
  x.spec = *manifest.tokenizer;
  x.languages = manifest.languages;
  load_model(x.source, manifest.dir / x.spec.source_model);
  load_model(x.target, manifest.dir / x.spec.target_model);
  if (!x.spec.source_vocab.empty()) {
    x.source_ids.emplace(), x.source_pieces.emplace();
    for (const auto& [piece, id] : read_vocab(manifest.dir / x.spec.source_vocab))  // an id's last piece wins
      (*x.source_ids)[piece] = id, (*x.source_pieces)[id] = piece;
  }
  if (!x.spec.target_vocab.empty()) {
    x.target_pieces.emplace();
    for (const auto& [piece, id] : read_vocab(manifest.dir / x.spec.target_vocab)) (*x.target_pieces)[id] = piece;
  }
  for (const std::string& piece : x.spec.special_pieces) x.specials.emplace_back(piece, x.piece_id(piece));
  std::stable_sort(x.specials.begin(), x.specials.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  x.drop.insert(x.spec.drop_ids.begin(), x.spec.drop_ids.end());
  return Tokenizer(std::move(impl));
}

Ids Tokenizer::pieces(const std::string& text) const { return impl_->pieces(text); }

Ids Tokenizer::encode(const std::string& text, const std::string& src_lang, const std::string& tgt_lang) const {
  if (blank(text)) throw Error("empty input sentence");
  return impl_->sentence(impl_->language_ids(src_lang, tgt_lang), text);
}

std::vector<Ids> Tokenizer::encode(const std::vector<std::string>& texts, const std::string& src_lang,
                                   const std::string& tgt_lang) const {
  const Ids prefix = impl_->language_ids(src_lang, tgt_lang);  // once, before any sentence's own error
  std::vector<Ids> out;
  for (size_t i = 0; i < texts.size(); ++i) {
    if (blank(texts[i])) throw Error("sentence " + std::to_string(i + 1) + " is empty");
    out.push_back(impl_->sentence(prefix, texts[i]));
  }
  return out;
}

std::pair<Ids, std::vector<std::string>> Tokenizer::source_tokens(const std::string& text, const std::string& src_lang,
                                                                   const std::string& tgt_lang) const {
  if (blank(text)) throw Error("empty input sentence");
  std::vector<std::string> surfaces;
  Ids ids = impl_->sentence(impl_->language_ids(src_lang, tgt_lang), text, &surfaces);
  return {std::move(ids), std::move(surfaces)};
}

std::optional<std::string> Tokenizer::source_piece(int64_t id) const {
  if (!impl_->source_ids) {
    if (id < 0 || id >= impl_->source.GetPieceSize()) return std::nullopt;
    return impl_->source.IdToPiece(static_cast<int>(id));
  }
  const auto it = impl_->source_pieces->find(id);
  return it == impl_->source_pieces->end() ? std::nullopt : std::optional<std::string>(it->second);
}

std::string Tokenizer::decode(const Ids& ids) const { return impl_->join(impl_->target_pieces_of(ids)); }

std::string Tokenizer::decode(const Ids& ids, const std::vector<std::pair<size_t, std::string>>& replacements) const {
  if (replacements.empty()) return decode(ids);
  std::unordered_map<size_t, const std::string*> at;
  for (const auto& [k, piece] : replacements) at[k] = &piece;
  std::vector<std::string> pieces;
  for (size_t k = 0; k < ids.size(); ++k) {
    if (const auto it = at.find(k); it != at.end()) pieces.push_back(*it->second);
    else if (!impl_->drop.count(ids[k]))
      if (auto piece = impl_->target_piece(ids[k])) pieces.push_back(std::move(*piece));
  }
  return impl_->join(pieces);
}

}  // namespace twostep
