// manifest.json: the artifact's contract (twostep/artifact.py reads the same file the same way).
#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <functional>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>
#include <openssl/evp.h>

#include "decoding.h"
#include "twostep/twostep.h"

namespace twostep {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {
constexpr const char* kFormat = "twostep-artifact";
// 3: a structured tokenizer (vocab tables, special pieces, languages), the decoder's start id and the ids it
// never generates. 2: the tokenizer one SentencePiece file; it reads as a plain TokenizerSpec.
constexpr int kSchemaVersion = 3, kOldestSchemaVersion = 2;
constexpr const char* kManifest = "manifest.json";
// The in-place decoders this library runs, preferred first, as the Python ort-cpu backend prefers them
// (OrtBackend.decoders, twostep/runtime/backends/ort.py). Each has the I/O of twostep.artifact.spec's inplace_spec,
// whatever ops run inside.
const char* const kInplaceDecoders[] = {"decoder_inplace"};

std::vector<std::string> names(const json& tensors) {
  std::vector<std::string> out;
  for (const auto& t : tensors) out.push_back(t.at("name").get<std::string>());
  return out;
}

Manifest::Graph read_graph(const std::string& name, const json& graph) {
  return {name, graph.at("file").get<std::string>(), names(graph.at("inputs")), names(graph.at("outputs"))};
}

// A plain relative path inside the artifact (twostep/artifact.py's safe_name): no absolute path, no '..'.
void check_name(const std::string& name, const std::string& where) {
  bool bad = name.empty() || name.find('\\') != std::string::npos || name.front() == '/' ||
             std::any_of(name.begin(), name.end(), [](unsigned char c) { return c < 32 || c == 127; });
  for (size_t start = 0; !bad;) {
    const size_t end = name.find('/', start);
    const std::string part = name.substr(start, end == std::string::npos ? std::string::npos : end - start);
    bad = part.empty() || part == "." || part == "..";
    if (end == std::string::npos) break;
    start = end + 1;
  }
  if (bad)
    throw Error(where + ": file name '" + name +
                "' must be a plain relative path inside the artifact (no absolute path, no '..')");
}

// dir / name, refused when a symbolic link on the way leads outside dir.
fs::path inside(const fs::path& dir, const std::string& name) {
  const fs::path path = dir / name;
  fs::path root, resolved;
  try {
    root = fs::weakly_canonical(dir), resolved = fs::weakly_canonical(path);
  } catch (const fs::filesystem_error& e) {  // a symbolic link loop, a name too long
    throw Error(path.string() + ": cannot resolve it (" + e.what() + ")");
  }
  if (std::mismatch(root.begin(), root.end(), resolved.begin(), resolved.end()).first != root.end())
    throw Error(path.string() + ": leads outside the artifact directory (to " + resolved.string() +
                "); artifacts must hold their files themselves");
  return path;
}

// Protobuf's wire format, just enough of it to find the external-data locations of an ONNX model (field
// numbers from onnx.proto) without reading tensor data: the raw bytes are skipped with seekg.
class OnnxScanner {
 public:
  explicit OnnxScanner(const fs::path& file) : file_(file), in_(file, std::ios::binary) {
    if (!in_) throw Error(file.string() + ": cannot read");
    in_.seekg(0, std::ios::end);
    size_ = static_cast<uint64_t>(in_.tellg());
    in_.seekg(0);
  }

  std::set<std::string> locations() {
    message(size_, 0, [&](int field, uint64_t end, int depth) {
      if (field == 7) graph(end, depth);          // ModelProto.graph
      else if (field == 25) function(end, depth);  // ModelProto.functions
      else skip(end);
    });
    return found_;
  }

 private:
  using Visit = std::function<void(int, uint64_t, int)>;  // (field of a length-delimited value, its end, depth)

  [[noreturn]] void corrupt() const { throw Error(file_.string() + ": not a readable ONNX model (corrupt protobuf)"); }

  uint64_t varint() {
    uint64_t value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      const int byte = in_.get();
      if (byte == EOF) corrupt();
      value |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if (!(byte & 0x80)) return value;
    }
    corrupt();
  }
  uint64_t pos() { return static_cast<uint64_t>(in_.tellg()); }
  void skip(uint64_t end) { in_.seekg(static_cast<std::streamoff>(end)); }
  std::string bytes(uint64_t end) {
    std::string out(end - pos(), '\0');
    if (!in_.read(out.data(), static_cast<std::streamsize>(out.size()))) corrupt();
    return out;
  }

  // Walks the fields of a message ending at `end`: length-delimited ones go to `visit`, varints to `number`.
  void message(uint64_t end, int depth, const Visit& visit, const std::function<void(int, uint64_t)>& number = {}) {
    if (depth > 64) corrupt();
    while (pos() < end) {
      const uint64_t key = varint();
      const int field = static_cast<int>(key >> 3);
      switch (key & 7) {
        case 0: { const uint64_t v = varint(); if (number) number(field, v); break; }
        case 1: skip(pos() + 8); break;
        case 5: skip(pos() + 4); break;
        case 2: {
          const uint64_t length = varint(), start = pos();
          if (length > end - start) corrupt();
          visit(field, start + length, depth + 1);
          if (pos() != start + length) corrupt();
          break;
        }
        default: corrupt();
      }
      if (pos() > end) corrupt();
    }
  }

  void graph(uint64_t end, int depth) {
    message(end, depth, [&](int field, uint64_t e, int d) {
      if (field == 1) node(e, d);                 // GraphProto.node
      else if (field == 5) tensor(e, d);          // .initializer
      else if (field == 15) sparse(e, d);         // .sparse_initializer
      else skip(e);
    });
  }
  void function(uint64_t end, int depth) {
    message(end, depth, [&](int field, uint64_t e, int d) { field == 7 ? node(e, d) : skip(e); });  // .node
  }
  void node(uint64_t end, int depth) {
    message(end, depth, [&](int field, uint64_t e, int d) { field == 5 ? attribute(e, d) : skip(e); });
  }
  void attribute(uint64_t end, int depth) {
    message(end, depth, [&](int field, uint64_t e, int d) {
      if (field == 5 || field == 10) tensor(e, d);        // AttributeProto.t, .tensors
      else if (field == 6 || field == 11) graph(e, d);    // .g, .graphs
      else if (field == 22 || field == 23) sparse(e, d);  // .sparse_tensor, .sparse_tensors
      else skip(e);
    });
  }
  void sparse(uint64_t end, int depth) {
    message(end, depth, [&](int field, uint64_t e, int d) { field == 1 || field == 2 ? tensor(e, d) : skip(e); });
  }
  void tensor(uint64_t end, int depth) {
    std::string name, location;
    bool external = false;
    message(end, depth, [&](int field, uint64_t e, int d) {
      if (field == 8) {
        name = bytes(e);  // TensorProto.name
      } else if (field == 13) {  // .external_data: StringStringEntryProto {key = 1, value = 2}
        external = true;
        std::string key, value;
        message(e, d, [&](int f, uint64_t e2, int) {
          if (f == 1) key = bytes(e2);
          else if (f == 2) value = bytes(e2);
          else skip(e2);
        });
        if (key == "location") location = value;
      } else {
        skip(e);
      }
    }, [&](int field, uint64_t value) { external |= field == 14 && value == 1; });  // .data_location EXTERNAL
    if (!external) return;
    if (location.empty())
      throw Error(file_.string() + ": tensor '" + name + "' has external data without a location");
    found_.insert(location);
  }

  fs::path file_;
  std::ifstream in_;
  uint64_t size_ = 0;
  std::set<std::string> found_;
};

// Schema 2's "tokenizer": one SentencePiece file, its own ids on both sides, eos after every source sentence,
// the four special ids left out of the text, no languages.
TokenizerSpec plain_tokenizer(const std::string& file, const Manifest& m) {
  TokenizerSpec t;
  t.source_model = t.target_model = file;
  t.source_suffix = {m.eos_id};
  t.drop_ids = {m.pad_id, m.unk_id, m.bos_id, m.eos_id};
  t.unk_id = m.unk_id;
  return t;
}

// A key that may be absent or null (then empty), else a string.
std::string name_or_empty(const json& object, const char* key) {
  const json value = object.value(key, json());
  return value.is_null() ? std::string() : value.get<std::string>();
}

// Schema 3's "tokenizer" object, with twostep/artifact/tokenizer.py's defaults: no vocab tables, no special
// pieces, no languages.
TokenizerSpec read_tokenizer(const json& tok) {
  TokenizerSpec t;
  t.kind = tok.value("kind", std::string("sentencepiece"));
  t.source_model = tok.at("source_model").get<std::string>();
  t.target_model = tok.at("target_model").get<std::string>();
  t.source_vocab = name_or_empty(tok, "source_vocab");
  t.target_vocab = name_or_empty(tok, "target_vocab");
  t.source_suffix = tok.at("source_suffix").get<Ids>();
  t.special_pieces = tok.value("special_pieces", json::array()).get<std::vector<std::string>>();
  t.drop_ids = tok.at("drop_ids").get<Ids>();
  t.unk_id = tok.at("unk_id").get<int64_t>();
  t.trailing_space = tok.value("trailing_space", json::array()).get<Ids>();
  t.detokenize = tok.value("detokenize", std::string("sentencepiece"));
  return t;
}

// Python's name of a JSON value's type, for messages that read as twostep/artifact/manifest.py's.
std::string python_type(const json& value) {
  switch (value.type()) {
    case json::value_t::string: return "str";
    case json::value_t::boolean: return "bool";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "int";
    case json::value_t::number_float: return "float";
    case json::value_t::array: return "list";
    case json::value_t::object: return "dict";
    default: return "NoneType";
  }
}

// Python's repr of a JSON scalar (a string in single quotes, True, None), for the same messages.
std::string python_repr(const json& value) {
  if (value.is_string()) return "'" + value.get<std::string>() + "'";
  if (value.is_boolean()) return value.get<bool>() ? "True" : "False";
  if (value.is_null()) return "None";
  return value.dump();
}

// The optional "decoding" section: the model's decoding defaults. Keys and JSON types as Python's parse_decoding
// checks them (DECODING_FIELDS), then the values as its DecodeOptions does (with_defaults): one Error each, that
// names every problem. `samples`: it says sampling true.
DecodeOptions read_decoding(const json& data, const std::string& where, bool& samples) {
  DecodeOptions out;
  if (data.is_null()) return out;
  if (!data.is_object())
    throw Error(where + ": malformed manifest ('decoding' is " + python_type(data) +
                ", expected an object of decoding options)");
  static const std::vector<std::pair<std::string, std::string>> kFields = {
      {"beam_size", "int"}, {"n_best", "int"}, {"length_penalty", "float"}, {"beam_stop", "str"},
      {"max_new_tokens", "int"}, {"min_new_tokens", "int"}, {"sampling", "bool"}, {"temperature", "float"},
      {"top_k", "int"}, {"top_p", "float"}, {"replace_unknowns", "bool"}, {"no_repeat_ngram_size", "int"}};
  std::string problems, known;
  for (const auto& field : kFields) known += (known.empty() ? "" : ", ") + field.first;
  auto problem = [&](const std::string& text) { problems += (problems.empty() ? "" : "; ") + text; };
  for (const auto& [key, value] : data.items()) {
    const auto field = std::find_if(kFields.begin(), kFields.end(), [&](const auto& f) { return f.first == key; });
    if (field == kFields.end()) {
      problem("unknown option '" + key.substr(0, 38) + "'");
      continue;
    }
    const std::string& kind = field->second;
    if (value.is_null() && key == "max_new_tokens") continue;  // null: 2 x source length + 16
    const std::string found = python_type(value);
    if (kind != found && !(kind == "float" && found == "int")) {  // JSON writes 1.0 as 1
      problem(key + " is " + found + " " + python_repr(value).substr(0, 40) + ", expected " + kind);
      continue;
    }
    // beyond the int DecodeOptions holds it in (top_k, which it does not hold, and the floats: their bounds, below)
    if (kind == "int" && key != "top_k" && std::abs(value.get<double>()) > std::numeric_limits<int>::max()) {
      problem(key + " is " + value.dump().substr(0, 40) + ", out of range");
      continue;
    }
    if (key == "beam_size") out.beam_size = value.get<int>();
    else if (key == "n_best") out.n_best = value.get<int>();
    else if (key == "length_penalty") out.length_penalty = value.get<double>();
    else if (key == "beam_stop") out.beam_stop = value.get<std::string>();
    else if (key == "max_new_tokens") out.max_new_tokens = value.get<int>();
    else if (key == "min_new_tokens") out.min_new_tokens = value.get<int>();
    else if (key == "sampling") samples = value.get<bool>();
    else if (key == "replace_unknowns") out.replace_unknowns = value.get<bool>();
    else if (key == "no_repeat_ngram_size") out.no_repeat_ngram_size = value.get<int>();
  }
  if (!problems.empty())
    throw Error(where + ": malformed manifest (decoding: " + problems + "; known options: " + known + ")");
  // The values, as DecodeOptions checks them (detail::kBounds); those of sampling too, which this library does not do.
  std::vector<std::string> bad = detail::option_problems(out, false);
  if (samples && out.beam_size.value_or(1) > 1) bad.push_back("sampling and beam search exclude each other: choose one");
  const detail::Bounds& bounds = detail::kBounds;
  for (const detail::Bound* bound : {&bounds.temperature, &bounds.top_k, &bounds.top_p})
    if (data.contains(bound->name) && !bound->admits(data.at(bound->name).get<double>()))
      bad.push_back(bound->problem(data.at(bound->name).dump()));
  std::string message;
  for (const std::string& b : bad) message += (message.empty() ? "" : "; ") + b;
  if (!message.empty()) throw Error(where + ": decoding: bad decoding options: " + message);
  return out;
}

// tokenizer.languages; absent or null: a model without languages (a target's source or decoder ids: none).
Languages read_languages(const json& tok) {
  Languages out;
  const json languages = tok.value("languages", json());
  if (languages.is_null()) return out;
  out.source = languages.value("source", json::object()).get<std::map<std::string, Ids>>();
  for (const auto& [code, ids] : languages.value("target", json::object()).get<std::map<std::string, json>>())
    out.target[code] = {ids.value("source", json::array()).get<Ids>(), ids.value("decoder", json::array()).get<Ids>()};
  const json aliases = languages.value("aliases", json::object());  // absent (older artifacts): model codes only
  out.aliases = aliases.get<std::map<std::string, std::vector<std::string>>>();
  out.default_source = name_or_empty(languages, "default_source");
  out.default_target = name_or_empty(languages, "default_target");
  return out;
}

bool all_in(const Ids& ids, int64_t size) {
  return std::all_of(ids.begin(), ids.end(), [&](int64_t id) { return id >= 0 && id < size; });
}

// The ids the manifest names must be ids of the vocabulary they are fed to; a default language one it has.
void check_ids(const Manifest& m, const std::string& where) {
  auto bad = [&](const std::string& what) { throw Error(where + ": malformed manifest (" + what + ")"); };
  for (int64_t id : {m.pad_id, m.unk_id, m.bos_id, m.eos_id, m.decoder_start_id})
    if (id < 0 || id >= m.tgt_vocab_size) bad("a special id is outside the vocab");
  if (!all_in(m.never_generate, m.tgt_vocab_size)) bad("model.never_generate has ids outside the target vocab");
  if (std::count(m.never_generate.begin(), m.never_generate.end(), m.eos_id))
    bad("model.never_generate holds the eos id: decoding could never end");
  if (!m.tokenizer) return;
  const TokenizerSpec& t = *m.tokenizer;
  auto source_ids = [&](const Ids& ids, const std::string& what) {
    if (!all_in(ids, m.src_vocab_size)) bad("tokenizer: " + what + " has ids outside the source vocab");
  };
  source_ids(t.source_suffix, "source_suffix");
  source_ids(t.trailing_space, "trailing_space");
  source_ids({t.unk_id}, "unk_id");
  if (!all_in(t.drop_ids, m.tgt_vocab_size)) bad("tokenizer: drop_ids has ids outside the target vocab");
  if (std::count(t.special_pieces.begin(), t.special_pieces.end(), std::string()))
    bad("tokenizer: special_pieces holds an empty piece");
  const Languages& l = m.languages;
  for (const auto& [code, ids] : l.source) source_ids(ids, "languages.source." + code);
  for (const auto& [code, ids] : l.target) {
    source_ids(ids.source, "languages.target." + code + ".source");
    if (!all_in(ids.decoder, m.tgt_vocab_size))
      bad("tokenizer: languages.target." + code + ".decoder has ids outside the target vocab");
  }
  auto check_default = [&](const std::string& code, bool known) {
    if (!code.empty() && !known) bad("tokenizer: default language '" + code + "' is not one of its languages");
  };
  for (const auto& [alias, codes] : l.aliases)
    for (const std::string& code : codes)
      if (!l.source.count(code) && !l.target.count(code))
        bad("tokenizer: languages.aliases." + alias + " names '" + code + "', which is not one of its languages");
  check_default(l.default_source, l.source.count(l.default_source));
  check_default(l.default_target, l.target.count(l.default_target));
}

// The files the runtime opens itself: the graphs and the tokenizer's.
std::vector<std::string> opened_files(const Manifest& m) {
  std::vector<std::string> out = {m.encoder.file, m.decoder.file};
  if (m.inplace) out.push_back(m.inplace->file);
  if (!m.tokenizer) return out;
  for (const std::string* name : {&m.tokenizer->source_model, &m.tokenizer->target_model,
                                  &m.tokenizer->source_vocab, &m.tokenizer->target_vocab})
    if (!name->empty()) out.push_back(*name);
  return out;
}

template <typename Codes>
std::string joined_codes(const Codes& codes) {
  std::string out;
  for (const auto& entry : codes) out += (out.empty() ? "" : ", ") + entry.first;
  return out;
}

using Aliases = std::map<std::string, std::vector<std::string>>;

// A normalized tag without its last subtag where that is a region (2 letters or 3 digits after the language and
// script): fr-ca -> fr, zh-hant-tw -> zh-hant; empty where it has none, or two. twostep/artifact/tokenizer.py's
// region_dropped.
bool ends_in_region(const std::string& tag) {
  const size_t dash = tag.rfind('-');
  if (dash == std::string::npos || dash == 0) return false;
  const std::string last = tag.substr(dash + 1);
  return (last.size() == 2 && std::all_of(last.begin(), last.end(), ::isalpha)) ||
         (last.size() == 3 && std::all_of(last.begin(), last.end(), ::isdigit));
}

std::string region_dropped(const std::string& key) {
  if (!ends_in_region(key)) return "";
  const std::string head = key.substr(0, key.rfind('-'));
  return ends_in_region(head) ? "" : head;  // one region only: fa-af-tw is no tag
}

// The model codes (of `codes`) a standard code means by the aliases: its own entry (lowercase, '-' for '_'), else
// its entry without the region; none where neither is listed. Python: standard_matches.
template <typename Codes>
std::vector<std::string> standard_matches(const std::string& code, const Codes& codes, const Aliases& aliases) {
  std::string key = code;
  for (char& c : key) c = c == '_' ? '-' : static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  auto found = aliases.find(key);
  if (found == aliases.end() && !region_dropped(key).empty()) found = aliases.find(region_dropped(key));
  std::vector<std::string> out;
  if (found == aliases.end()) return out;
  for (const std::string& own : found->second)
    if (codes.count(own)) out.push_back(own);  // the aliases are the model's codes of either side
  std::sort(out.begin(), out.end());
  return out;
}

// `code`, or `fallback` when it is empty, checked against the codes a model has (sorted, as a std::map holds
// them), or the one a standard code means (aliases); none at all is an error where the model `needs` one.
// `side`: "source" or "target"; `flag`: the example program's option that gives it. Python:
// twostep/artifact/tokenizer.py's Languages.pick, whose messages these are.
template <typename Codes>
std::string pick_language(const Codes& codes, const Aliases& aliases, const std::string& code,
                          const std::string& fallback, bool needs, const std::string& side, const std::string& flag) {
  const std::string chosen = code.empty() ? fallback : code;
  if (chosen.empty()) {
    if (!needs) return chosen;
    throw Error("this model needs a " + side + " language: " + flag + " one of " + joined_codes(codes));
  }
  if (codes.count(chosen)) return chosen;
  const std::vector<std::string> matches = standard_matches(chosen, codes, aliases);
  if (matches.size() == 1) return matches[0];
  if (!matches.empty()) {
    std::string candidates;
    for (const std::string& m : matches) candidates += (candidates.empty() ? "" : " or ") + m;
    throw Error("ambiguous " + side + " language '" + chosen + "': it may be " + candidates + "; name one of them");
  }
  throw Error("unknown " + side + " language '" + chosen + "': this model has " +
              (codes.empty() ? "no " + side + " languages" : joined_codes(codes)));
}

// The first in-place decoder of kInplaceDecoders that `variants` holds, checked: the decoder's inputs and outputs,
// each self-attention cache of one shape in and out (the one buffer).
std::optional<Manifest::Graph> read_inplace(const json& variants, const Manifest::Graph& decoder,
                                            const std::string& where) {
  if (!variants.is_object()) throw Error(where + ": malformed manifest ('variants' is " + variants.type_name() + ")");
  auto as_set = [](const std::vector<std::string>& list) { return std::set<std::string>(list.begin(), list.end()); };
  for (const char* name : kInplaceDecoders) {
    if (!variants.contains(name)) continue;
    const json& entry = variants.at(name);
    Manifest::Graph graph = read_graph(name, entry);
    bool ok = as_set(graph.inputs) == as_set(decoder.inputs) && as_set(graph.outputs) == as_set(decoder.outputs);
    for (const auto& past : entry.at("inputs")) {
      const std::string past_name = past.at("name").get<std::string>();
      if (past_name.rfind("past_", 0) != 0 || past_name.find("_self_") == std::string::npos) continue;
      for (const auto& present : entry.at("outputs"))
        if (present.at("name") == "present_" + past_name.substr(5)) ok = ok && present.at("shape") == past.at("shape");
    }
    if (!ok)
      throw Error(where + ": malformed manifest (variants." + name + ": its inputs and outputs are not the in-place "
                  "decoder's); re-export the artifact");
    return graph;
  }
  return std::nullopt;
}

// [batch, heads, len, head_dim] of one decoder input.
const json& kv_shape(const json& decoder, const std::string& name, const std::string& where) {
  for (const auto& t : decoder.at("inputs"))
    if (t.at("name") == name) return t.at("shape");
  throw Error(where + ": malformed manifest (the decoder has no input " + name + ")");
}
}  // namespace

// A source language is needed where one has tokens to put before the source. MADLAD's source languages have none
// (the model reads any language): they may be left out.
std::string Languages::source_code(const std::string& code) const {
  const bool needs = std::any_of(source.begin(), source.end(), [](const auto& s) { return !s.second.empty(); });
  return pick_language(source, aliases, code, default_source, needs, "source", "--src-lang");
}

// A target language is needed where one has tokens to force on the decoder. Marian's and MADLAD's go into the
// source, where their users may type them themselves (">>fra<< text", "<2fr> text"), so they may be left out.
std::string Languages::target_code(const std::string& code) const {
  const bool needs = std::any_of(target.begin(), target.end(), [](const auto& t) { return !t.second.decoder.empty(); });
  return pick_language(target, aliases, code, default_target, needs, "target", "--tgt-lang");
}

std::set<std::string> external_data_locations(const fs::path& graph_file) {
  return OnnxScanner(graph_file).locations();
}

void Manifest::check_external_data() const {
  for (const Graph* graph : {&encoder, &decoder, inplace ? &*inplace : nullptr}) {
    if (!graph) continue;
    const fs::path file = dir / graph->file;
    for (const std::string& location : external_data_locations(file)) {
      check_name(location, file.string() + ": external data");
      if (!files.count(location))
        throw Error(file.string() + ": its external data '" + location + "' is not listed in " + kManifest +
                    " with a sha256; the runtime opens only listed, hashed files");
    }
  }
}

std::string sha256_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path.string() + ": cannot read");
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  if (!ctx || !EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr)) throw Error("sha256: OpenSSL init failed");
  std::vector<char> block(1 << 20);
  while (in.read(block.data(), block.size()) || in.gcount() > 0)
    EVP_DigestUpdate(ctx.get(), block.data(), static_cast<size_t>(in.gcount()));
  if (in.bad()) throw Error(path.string() + ": read error");
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  EVP_DigestFinal_ex(ctx.get(), digest, &size);
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < size; ++i) out += {hex[digest[i] >> 4], hex[digest[i] & 15]};
  return out;
}

Manifest Manifest::read(const fs::path& dir, bool check_hashes) {
  const fs::path file = dir / kManifest;
  const std::string where = file.string();
  if (!fs::is_directory(dir))
    throw Error(dir.string() + ": not an artifact directory (expected a folder with " + kManifest +
                "); create one with `twostep export`");
  if (!fs::is_regular_file(file))
    throw Error(dir.string() + ": missing " + kManifest + "; create the directory with `twostep export`");
  json j;
  try {
    std::ifstream in(file);
    j = json::parse(in);
  } catch (const json::parse_error& e) {
    throw Error(where + ": not valid JSON (" + e.what() + ")");
  }
  if (!j.is_object() || j.value("format", json()) != kFormat)
    throw Error(where + ": not a twostep manifest (format != '" + kFormat + "')");
  const json version = j.value("schema_version", json());
  // The messages of twostep/artifact/manifest.py's schema_message.
  if (version.is_number_integer() && version.get<int64_t>() >= 1 && version.get<int64_t>() < kOldestSchemaVersion)
    throw Error(where + ": schema version " + version.dump() +
                ", exported by an older twostep whose decoder runs every row at one position; this twostep reads "
                "version " + std::to_string(kSchemaVersion) +
                " (rows at different positions, so sentences can join a running batch): re-export it from its "
                "checkpoint with `twostep export CHECKPOINT --out DIR --force`");
  if (version != kOldestSchemaVersion && version != kSchemaVersion)
    throw Error(where + ": schema version " + version.dump() + ", this twostep reads versions " +
                std::to_string(kOldestSchemaVersion) + " and " + std::to_string(kSchemaVersion) +
                "; re-export with this twostep or install the matching one");
  Manifest m;
  m.dir = dir;
  try {
    const json& model = j.at("model");
    m.src_vocab_size = model.at("src_vocab_size").get<int64_t>();
    m.tgt_vocab_size = model.at("tgt_vocab_size").get<int64_t>();
    m.max_positions = model.at("max_positions").get<int64_t>();
    m.pad_id = model.at("pad_id").get<int64_t>();
    m.unk_id = model.at("unk_id").get<int64_t>();
    m.bos_id = model.at("bos_id").get<int64_t>();
    m.eos_id = model.at("eos_id").get<int64_t>();
    const json start = model.value("decoder_start_id", json());  // absent (schema 2) or null: bos
    m.decoder_start_id = start.is_null() ? m.bos_id : start.get<int64_t>();
    m.never_generate = model.value("never_generate", json::array()).get<Ids>();
    m.alignment_heads = model.value("alignment_heads", int64_t{0});  // absent (before alignment heads): none
    m.alignment_layer = model.value("alignment_layer", int64_t{-1});
    m.dtype = j.at("dtype").get<std::string>();
    const json tokenizer = j.value("tokenizer", json());
    if (tokenizer.is_null()) {
    } else if (version == kOldestSchemaVersion) {  // one SentencePiece file whose ids are the model's
      if (!tokenizer.is_string())
        throw Error(where + ": malformed manifest ('tokenizer' is " + tokenizer.type_name() + ")");
      m.tokenizer = plain_tokenizer(tokenizer.get<std::string>(), m);
    } else {
      if (!tokenizer.is_object())
        throw Error(where + ": malformed manifest (tokenizer: expected an object, got " + tokenizer.type_name() + ")");
      m.tokenizer = read_tokenizer(tokenizer);
      if (m.tokenizer->kind != "sentencepiece" && m.tokenizer->kind != "tokenizers" && m.tokenizer->kind != "moses-bpe")
        throw Error(where + ": malformed manifest (tokenizer: kind '" + m.tokenizer->kind +
                    "' is not one of sentencepiece, tokenizers, moses-bpe)");
      if (m.tokenizer->detokenize != "sentencepiece" && m.tokenizer->detokenize != "argos")
        throw Error(where + ": malformed manifest (tokenizer: detokenize '" + m.tokenizer->detokenize.substr(0, 30) +
                    "' is not one of sentencepiece, argos)");
      m.languages = read_languages(tokenizer);
    }
    m.encoder = read_graph("encoder", j.at("graphs").at("encoder"));
    m.decoder = read_graph("decoder", j.at("graphs").at("decoder"));
    m.inplace = read_inplace(j.value("variants", json::object()), m.decoder, where);  // none in older artifacts
    const json& key = kv_shape(j["graphs"]["decoder"], "past_key_self_0", where);
    m.n_heads = key.at(1).get<int64_t>();
    m.head_dim_k = key.at(3).get<int64_t>();
    m.head_dim_v = kv_shape(j["graphs"]["decoder"], "past_value_self_0", where).at(3).get<int64_t>();
    for (const auto& t : j["graphs"]["decoder"].at("outputs"))
      if (t.at("name") == "top_ids") m.search_width = t.at("shape").at(1).get<int64_t>();
      else if (t.at("name") == "alignment") m.alignment = true;
    m.files = j.at("files").get<std::map<std::string, std::string>>();
    m.decoding = read_decoding(j.value("decoding", json()), where, m.samples);
  } catch (const json::exception& e) {
    throw Error(where + ": malformed manifest (missing or wrong " + e.what() + ")");
  }
  if (m.src_vocab_size <= 0 || m.tgt_vocab_size <= 0 || m.max_positions <= 0 || m.n_heads <= 0 ||
      m.head_dim_k <= 0 || m.head_dim_v <= 0 || m.search_width < 0 || m.search_width > m.tgt_vocab_size)
    throw Error(where + ": malformed manifest (sizes must be positive)");
  if (m.alignment != (m.alignment_heads > 0))
    throw Error(where + ": malformed manifest (model.alignment_heads is " + std::to_string(m.alignment_heads) +
                (m.alignment ? " but" : " and") + " the decoder " + (m.alignment ? "has" : "lacks") +
                " the alignment output; re-export the artifact)");
  check_ids(m, where);
  // Every file the runtime opens is listed and hashed; every listed name stays inside the directory.
  for (const std::string& name : opened_files(m)) {
    check_name(name, where);
    if (!m.files.count(name))
      throw Error(where + ": " + name + " is not listed in 'files' with its sha256; the runtime opens only "
                  "listed, hashed files: re-export the artifact");
  }
  for (const auto& [name, expected] : m.files) {
    check_name(name, where);
    const fs::path path = inside(dir, name);
    if (!fs::is_regular_file(path)) throw Error(path.string() + ": missing (listed in " + kManifest + ")");
    if (check_hashes && sha256_file(path) != expected)
      throw Error(path.string() + ": sha256 does not match " + kManifest +
                  "; the file was changed or damaged, re-export the artifact");
  }
  return m;
}

}  // namespace twostep
