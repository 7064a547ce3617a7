// Unit tests of the manifest reader, the tokenizer, the decoding loop (on a scripted StepSession), the
// numpy-compatible sum and the CUDA provider's options, on small artifact directories made here.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <tuple>
#include <unistd.h>

#include "decoding.h"
#include "providers.h"
#include "scripted_session.h"
#include "twostep/twostep.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {
void write(const fs::path& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

json tensor(const std::string& name, json shape) { return {{"name", name}, {"dtype", "float32"}, {"shape", shape}}; }

// A directory with two fake graph files and a manifest listing their sha256 (the reader does not open graphs).
struct Artifact {
  fs::path dir;
  json manifest;

  Artifact() {
    static int counter = 0;
    dir = fs::temp_directory_path() / ("twostep-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    fs::remove_all(dir);
    fs::create_directories(dir);
    write(dir / "encoder.onnx", "not really an encoder");
    write(dir / "decoder.onnx", "not really a decoder");
    manifest = {
        {"format", "twostep-artifact"},
        {"schema_version", 2},
        {"model", {{"src_vocab_size", 50}, {"tgt_vocab_size", 60}, {"max_positions", 64}, {"pad_id", 0},
                   {"unk_id", 1}, {"bos_id", 2}, {"eos_id", 3}}},
        {"dtype", "float32"},
        {"tokenizer", nullptr},
        {"graphs",
         {{"encoder", {{"file", "encoder.onnx"},
                       {"inputs", {tensor("input_ids", {"batch", "src_len"}), tensor("attention_mask", {"batch", "src_len"})}},
                       {"outputs", {tensor("present_key_cross_0", {"batch", 4, "src_len", 8}),
                                    tensor("present_value_cross_0", {"batch", 4, "src_len", 6})}}}},
          {"decoder", {{"file", "decoder.onnx"},
                       {"inputs", {tensor("input_ids", {"batch", "new_len"}),
                                   tensor("encoder_attention_mask", {"batch", "src_len"}),
                                   tensor("past_lengths", {"batch"}),
                                   tensor("past_key_self_0", {"batch", 4, "past_len", 8}),
                                   tensor("past_value_self_0", {"batch", 4, "past_len", 6})}},
                       {"outputs", {tensor("logits", {"batch", "new_len", 60})}}}}}},
        {"files", {{"encoder.onnx", twostep::sha256_file(dir / "encoder.onnx")},
                   {"decoder.onnx", twostep::sha256_file(dir / "decoder.onnx")}}},
    };
    save();
  }
  ~Artifact() { fs::remove_all(dir); }
  void save() const { write(dir / "manifest.json", manifest.dump(2)); }
  // A file of the artifact, listed in the manifest with its sha256 (save() writes the manifest).
  void add(const std::string& name, const std::string& content) {
    write(dir / name, content);
    manifest["files"][name] = twostep::sha256_file(dir / name);
  }
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const twostep::Error& e) {
    return e.what();
  }
  return "";
}

std::string error_of(const fs::path& dir) {
  return error_of([&] { twostep::Manifest::read(dir); });
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }
}  // namespace

TEST_CASE("sha256 of a file") {
  Artifact a;
  write(a.dir / "abc", "abc");
  CHECK(twostep::sha256_file(a.dir / "abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST_CASE("a good manifest") {
  Artifact a;
  const twostep::Manifest m = twostep::Manifest::read(a.dir);
  CHECK(m.src_vocab_size == 50);
  CHECK(m.tgt_vocab_size == 60);
  CHECK(m.max_positions == 64);
  CHECK(m.eos_id == 3);
  CHECK(m.dtype == "float32");
  CHECK(!m.tokenizer);
  CHECK(m.decoder_start_id == 2);  // schema 2: bos
  CHECK(m.never_generate.empty());
  CHECK(m.languages.source.empty());
  CHECK(m.n_heads == 4);
  CHECK(m.head_dim_k == 8);
  CHECK(m.head_dim_v == 6);
  CHECK(m.decoder.file == "decoder.onnx");
  CHECK(m.decoder.inputs == std::vector<std::string>{"input_ids", "encoder_attention_mask", "past_lengths",
                                                     "past_key_self_0", "past_value_self_0"});
  CHECK(m.encoder.outputs.size() == 2);
  CHECK(m.files.size() == 2);
}

TEST_CASE("the in-place decoder: read from variants, listed and hashed, its cache one shape in and out") {
  Artifact a;
  CHECK(!twostep::Manifest::read(a.dir).inplace);  // an older artifact, or --no-inplace-cache
  json& decoder = a.manifest["graphs"]["decoder"];
  decoder["outputs"].push_back(tensor("present_key_self_0", {"batch", 4, "past_len + new_len", 8}));
  decoder["outputs"].push_back(tensor("present_value_self_0", {"batch", 4, "past_len + new_len", 6}));
  json inplace = decoder;
  inplace["file"] = "decoder_inplace.onnx";
  for (json* tensors : {&inplace["inputs"], &inplace["outputs"]})
    for (json& t : *tensors)
      if (t["name"].get<std::string>().find("_self_") != std::string::npos) t["shape"][2] = "capacity";
  a.manifest["variants"] = {{"decoder_inplace", inplace}, {"decoder_of_a_newer_twostep", {{"file", "x.onnx"}}}};
  a.save();
  CHECK(contains(error_of(a.dir), "decoder_inplace.onnx is not listed in 'files' with its sha256"));
  a.add("decoder_inplace.onnx", "not really an in-place decoder");
  a.save();
  const twostep::Manifest m = twostep::Manifest::read(a.dir);
  REQUIRE(m.inplace);
  CHECK(m.inplace->name == "decoder_inplace");
  CHECK(m.inplace->file == "decoder_inplace.onnx");
  CHECK(m.inplace->inputs == m.decoder.inputs);
  CHECK(m.inplace->outputs == m.decoder.outputs);

  a.manifest["variants"]["decoder_inplace"]["outputs"][2]["shape"][2] = "capacity + 1";  // present_value_self_0
  a.save();
  CHECK(contains(error_of(a.dir), "malformed manifest (variants.decoder_inplace: its inputs and outputs are not the "
                                  "in-place decoder's); re-export the artifact"));
  a.manifest["variants"]["decoder_inplace"] = inplace;
  a.manifest["variants"]["decoder_inplace"]["inputs"].erase(2);  // past_lengths
  a.save();
  CHECK(contains(error_of(a.dir), "variants.decoder_inplace: its inputs and outputs are not the in-place decoder's"));
  a.manifest["variants"] = json::array();
  a.save();
  CHECK(contains(error_of(a.dir), "malformed manifest ('variants' is array)"));
}

TEST_CASE("wrong schema version") {
  Artifact a;
  a.manifest["schema_version"] = 4;
  a.save();
  CHECK(contains(error_of(a.dir), "manifest.json: schema version 4, this twostep reads versions 2 and 3; re-export "
                                  "with this twostep or install the matching one"));
  a.manifest["schema_version"] = "3";
  a.save();
  CHECK(contains(error_of(a.dir), "manifest.json: schema version \"3\", this twostep reads versions 2 and 3"));
}

TEST_CASE("an artifact of the older schema asks to be re-exported") {
  Artifact a;
  a.manifest["schema_version"] = 1;
  a.save();
  const std::string e = error_of(a.dir);
  CHECK(contains(e, "manifest.json: schema version 1, exported by an older twostep"));
  CHECK(contains(e, "this twostep reads version 3 (rows at different positions"));
  CHECK(contains(e, "re-export it from its checkpoint with `twostep export CHECKPOINT --out DIR --force`"));
}

TEST_CASE("not a twostep manifest") {
  Artifact a;
  a.manifest["format"] = "something-else";
  a.save();
  CHECK(contains(error_of(a.dir), "not a twostep manifest"));
}

TEST_CASE("missing file") {
  Artifact a;
  fs::remove(a.dir / "decoder.onnx");
  const std::string e = error_of(a.dir);
  CHECK(contains(e, "decoder.onnx: missing (listed in manifest.json)"));
}

TEST_CASE("sha256 mismatch names the file") {
  Artifact a;
  write(a.dir / "encoder.onnx", "changed");
  const std::string e = error_of(a.dir);
  CHECK(contains(e, "encoder.onnx: sha256 does not match manifest.json"));
  CHECK_NOTHROW(twostep::Manifest::read(a.dir, /*check_hashes=*/false));
}

TEST_CASE("bad JSON") {
  Artifact a;
  write(a.dir / "manifest.json", "{\"format\": \"twostep-artifact\", ");
  CHECK(contains(error_of(a.dir), "manifest.json: not valid JSON"));
}

TEST_CASE("malformed manifest") {
  Artifact a;
  a.manifest.erase("graphs");
  a.save();
  CHECK(contains(error_of(a.dir), "malformed manifest"));
}

TEST_CASE("not a directory, no manifest") {
  Artifact a;
  CHECK(contains(error_of(a.dir / "nope"), "not an artifact directory"));
  fs::remove(a.dir / "manifest.json");
  CHECK(contains(error_of(a.dir), "missing manifest.json"));
}

TEST_CASE("pairwise_sum rounds like numpy's float64 sum") {
  std::mt19937_64 rng(0);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int64_t n : {1, 7, 8, 9, 127, 128, 129, 1000, 32000}) {
    std::vector<double> a(n);
    for (auto& x : a) x = u(rng);
    double naive = 0;
    for (double x : a) naive += x;
    CHECK(twostep::detail::pairwise_sum(a.data(), n) == doctest::Approx(naive).epsilon(1e-12));
  }
  const double small[] = {0.1, 0.2, 0.3};  // fewer than 8: left to right
  CHECK(twostep::detail::pairwise_sum(small, 3) == (0.1 + 0.2) + 0.3);
}

// --- schema 3: the tokenizer section, the decoder's start id, never_generate

namespace {
std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// A schema-3 manifest: a Marian-like tokenizer section (the demo SentencePiece model on both sides, vocab tables
// that renumber its pieces, special pieces, languages) over the fake graphs.
struct Schema3 : Artifact {
  explicit Schema3(const std::string& spm = "fake") {
    manifest["schema_version"] = 3;
    manifest["model"]["decoder_start_id"] = 0;
    manifest["model"]["never_generate"] = {0};
    manifest["model"]["activation"] = "gelu";
    manifest["model"]["positions"] = "marian";
    manifest["model"]["position_offset"] = 0;
    add("source.spm", spm);
    add("source_vocab.json", json{{"</s>", 0}, {"<unk>", 1}, {"<pad>", 2}, {"\u2581three", 10}, {"\u2581hundred", 11},
                                  {"\u2581", 12}, {"and", 13}, {">>fr<<", 20}, {">>de<<", 21}, {">>f", 22}}.dump());
    add("target_vocab.json", json{{"</s>", 0}, {"<pad>", 2}, {"\u2581three", 5}, {"\u2581hundred", 6}, {"and", 7},
                                  {"xyz\u2581q", 8}, {"\u2581", 9}, {"\u3000", 10}}.dump());
    manifest["tokenizer"] = {
        {"source_model", "source.spm"}, {"target_model", "source.spm"},
        {"source_vocab", "source_vocab.json"}, {"target_vocab", "target_vocab.json"},
        {"source_suffix", {0}}, {"special_pieces", {"</s>", "<unk>", "<pad>", ">>fr<<", ">>de<<", ">>f"}},
        {"drop_ids", {0, 1, 2}}, {"unk_id", 1},
        {"languages", {{"source", {{"en", {30}}}},
                       {"target", {{"fr", {{"source", {20}}, {"decoder", {40}}}},
                                   {"de", {{"source", {21}}, {"decoder", {41, 42}}}}}},
                       {"default_source", nullptr}, {"default_target", nullptr}}},
    };
    save();
  }
};
}  // namespace

TEST_CASE("a schema-3 manifest with a tokenizer section") {
  Schema3 a;
  const twostep::Manifest m = twostep::Manifest::read(a.dir);
  CHECK(m.decoder_start_id == 0);
  CHECK(m.never_generate == twostep::Ids{0});
  REQUIRE(m.tokenizer);
  const twostep::TokenizerSpec& t = *m.tokenizer;
  CHECK(t.source_model == "source.spm");
  CHECK(t.target_model == "source.spm");
  CHECK(t.source_vocab == "source_vocab.json");
  CHECK(t.target_vocab == "target_vocab.json");
  CHECK(t.source_suffix == twostep::Ids{0});
  CHECK(t.special_pieces.size() == 6);
  CHECK(t.drop_ids == twostep::Ids{0, 1, 2});
  CHECK(t.unk_id == 1);
  CHECK(m.languages.source.at("en") == twostep::Ids{30});
  CHECK(m.languages.target.at("de").decoder == twostep::Ids{41, 42});
  CHECK(m.languages.target.at("fr").source == twostep::Ids{20});
  CHECK(m.languages.default_source.empty());

  a.manifest["model"]["decoder_start_id"] = nullptr;  // null: bos
  a.manifest["tokenizer"]["source_vocab"] = nullptr;  // null: SentencePiece's own ids
  a.manifest["tokenizer"].erase("target_vocab");      // absent: the same
  a.manifest["tokenizer"].erase("special_pieces");    // absent: none
  a.manifest["tokenizer"]["languages"]["target"]["fr"].erase("source");  // absent: none
  a.save();
  const twostep::Manifest m2 = twostep::Manifest::read(a.dir);
  CHECK(m2.decoder_start_id == m2.bos_id);
  CHECK(m2.tokenizer->source_vocab.empty());
  CHECK(m2.tokenizer->target_vocab.empty());
  CHECK(m2.tokenizer->special_pieces.empty());
  CHECK(m2.languages.target.at("fr").source.empty());
  CHECK(m2.languages.aliases.empty());  // absent (an older artifact): model codes only
  a.manifest["tokenizer"]["languages"]["aliases"] = {{"fr", {"fr"}}, {"fra", {"fr"}}, {"zh-tw", json::array()}};
  a.save();
  const twostep::Manifest m3 = twostep::Manifest::read(a.dir);
  CHECK(m3.languages.aliases.at("fra") == std::vector<std::string>{"fr"});
  CHECK(m3.languages.aliases.at("zh-tw").empty());
  CHECK(m3.languages.target_code("fra-FR") == "fr");
  CHECK(m3.languages.target_code("FRA") == "fr");
  a.manifest["tokenizer"]["languages"] = nullptr;  // null: no languages
  a.save();
  CHECK(twostep::Manifest::read(a.dir).languages.target.empty());
}

TEST_CASE("schema 3: every tokenizer file is listed and hashed") {
  Schema3 a;
  a.manifest["files"].erase("target_vocab.json");
  a.save();
  CHECK(contains(error_of(a.dir), "target_vocab.json is not listed in 'files' with its sha256"));
  a.manifest["tokenizer"]["target_vocab"] = "../target_vocab.json";
  a.save();
  CHECK(contains(error_of(a.dir), "file name '../target_vocab.json' must be a plain relative path"));
  Schema3 b;
  write(b.dir / "source.spm", "changed");
  CHECK(contains(error_of(b.dir), "source.spm: sha256 does not match manifest.json"));
}

TEST_CASE("schema 3: malformed tokenizer sections and ids") {
  const std::vector<std::pair<std::function<void(json&)>, std::string>> cases = {
      {[](json& j) { j["tokenizer"].erase("drop_ids"); }, "malformed manifest (missing or wrong"},
      {[](json& j) { j["tokenizer"]["source_suffix"] = "eos"; }, "malformed manifest (missing or wrong"},
      {[](json& j) { j["tokenizer"] = 7; }, "malformed manifest (tokenizer: expected an object, got number)"},
      {[](json& j) { j["schema_version"] = 2; }, "malformed manifest ('tokenizer' is object)"},
      {[](json& j) { j["tokenizer"]["languages"]["default_target"] = "it"; },
       "tokenizer: default language 'it' is not one of its languages"},
      {[](json& j) { j["tokenizer"]["languages"]["target"]["fr"]["decoder"] = {60}; },
       "tokenizer: languages.target.fr.decoder has ids outside the target vocab"},
      {[](json& j) { j["tokenizer"]["languages"]["source"]["en"] = {50}; },
       "tokenizer: languages.source.en has ids outside the source vocab"},
      {[](json& j) { j["tokenizer"]["drop_ids"] = {60}; }, "tokenizer: drop_ids has ids outside the target vocab"},
      {[](json& j) { j["tokenizer"]["languages"]["aliases"] = {{"it", {"it"}}}; },
       "tokenizer: languages.aliases.it names 'it', which is not one of its languages"},
      {[](json& j) { j["tokenizer"]["languages"]["aliases"] = {{"it", "fr"}}; },
       "malformed manifest (missing or wrong"},
      {[](json& j) { j["tokenizer"]["languages"]["target"] = {1, 2}; }, "malformed manifest (missing or wrong"},
      {[](json& j) { j["tokenizer"]["special_pieces"] = {""}; }, "special_pieces holds an empty piece"},
      {[](json& j) { j["tokenizer"]["trailing_space"] = {50}; },
       "tokenizer: trailing_space has ids outside the source vocab"},
      {[](json& j) { j["tokenizer"]["kind"] = "wordpiece"; },
       "malformed manifest (tokenizer: kind 'wordpiece' is not one of sentencepiece, tokenizers, moses-bpe)"},
      {[](json& j) { j["model"]["never_generate"] = {3}; }, "never_generate holds the eos id"},
      {[](json& j) { j["model"]["never_generate"] = {60}; }, "never_generate has ids outside the target vocab"},
      {[](json& j) { j["model"]["decoder_start_id"] = 60; }, "a special id is outside the vocab"},
  };
  for (const auto& [damage, message] : cases) {
    Schema3 a;
    damage(a.manifest);
    a.save();
    CHECK_MESSAGE(contains(error_of(a.dir), message), message);
  }
}

TEST_CASE("schema 2's tokenizer file reads as a plain SentencePiece tokenizer") {
  Artifact a;
  a.add("tokenizer.model", "fake");
  a.manifest["tokenizer"] = "tokenizer.model";
  a.save();
  const twostep::Manifest m = twostep::Manifest::read(a.dir);
  REQUIRE(m.tokenizer);
  CHECK(m.tokenizer->source_model == "tokenizer.model");
  CHECK(m.tokenizer->target_model == "tokenizer.model");
  CHECK(m.tokenizer->source_vocab.empty());
  CHECK(m.tokenizer->target_vocab.empty());
  CHECK(m.tokenizer->source_suffix == twostep::Ids{3});
  CHECK(m.tokenizer->special_pieces.empty());
  CHECK(m.tokenizer->drop_ids == twostep::Ids{0, 1, 2, 3});
  CHECK(m.languages.source.empty());
  CHECK(m.languages.target.empty());
  a.manifest["files"].erase("tokenizer.model");
  a.save();
  CHECK(contains(error_of(a.dir), "tokenizer.model is not listed in 'files' with its sha256"));
}

TEST_CASE("languages: the default, or one the model has") {
  twostep::Languages none;
  CHECK(none.source_code("") == "");
  CHECK(none.target_code("") == "");
  CHECK(error_of([&] { none.source_code("xx"); }) ==
        "unknown source language 'xx': this model has no source languages");
  CHECK(error_of([&] { none.target_code("xx"); }) ==
        "unknown target language 'xx': this model has no target languages");

  twostep::Languages m2m;
  m2m.source = {{"fr", {5}}, {"en", {4}}, {"de", {6}}};
  m2m.target = {{"fr", {{}, {15}}}, {"en", {{}, {14}}}};
  CHECK(error_of([&] { m2m.source_code(""); }) == "this model needs a source language: --src-lang one of de, en, fr");
  CHECK(error_of([&] { m2m.target_code(""); }) == "this model needs a target language: --tgt-lang one of en, fr");
  CHECK(error_of([&] { m2m.source_code("it"); }) == "unknown source language 'it': this model has de, en, fr");
  CHECK(error_of([&] { m2m.target_code("de"); }) == "unknown target language 'de': this model has en, fr");
  CHECK(m2m.source_code("de") == "de");
  m2m.default_source = "en";
  m2m.default_target = "fr";
  CHECK(m2m.source_code("") == "en");
  CHECK(m2m.target_code("") == "fr");
  CHECK(m2m.target_code("en") == "en");

  // Marian: the target language's token goes into the source, where users may type it themselves: optional.
  twostep::Languages marian;
  marian.target = {{"fra", {{50}, {}}}, {"spa", {{51}, {}}}};
  CHECK(marian.target_code("") == "");
  CHECK(marian.target_code("spa") == "spa");
  CHECK(error_of([&] { marian.target_code("deu"); }) == "unknown target language 'deu': this model has fra, spa");

  // MADLAD: source languages without ids (optional, as Python's Languages.pick), the target's ids in the source.
  twostep::Languages madlad;
  madlad.source = {{"en", {}}, {"fr", {}}};
  madlad.target = {{"fr", {{40}, {}}}, {"de", {{41}, {}}}};
  CHECK(madlad.source_code("") == "");
  CHECK(madlad.source_code("fr") == "fr");
  CHECK(error_of([&] { madlad.source_code("it"); }) == "unknown source language 'it': this model has en, fr");
  CHECK(madlad.target_code("") == "");
  CHECK(madlad.target_code("de") == "de");
}

TEST_CASE("languages: a standard code means the model code its aliases name, as Python's Languages.pick") {
  // The aliases twostep/artifact/tokenizer.py's standard_aliases writes for these codes (a region tag only where
  // dropping its region would mean another code).
  twostep::Languages nllb;
  nllb.source = {{"fra_Latn", {5}}, {"zho_Hans", {6}}, {"zho_Hant", {7}}};
  nllb.target = {{"fra_Latn", {{}, {15}}}, {"zho_Hans", {{}, {16}}}, {"zho_Hant", {{}, {17}}}};
  nllb.aliases = {{"fr", {"fra_Latn"}}, {"fra", {"fra_Latn"}}, {"fre", {"fra_Latn"}}, {"fra-latn", {"fra_Latn"}},
                  {"zh", {"zho_Hans"}}, {"zh-hant", {"zho_Hant"}}, {"zh-tw", {"zho_Hant"}}};
  for (const char* code : {"fr", "fra", "fre", "fr-FR", "fr_CA", "FR", "fra_LATN", "fr-419", "fra_Latn"})
    CHECK(nllb.target_code(code) == "fra_Latn");
  CHECK(nllb.source_code("zh") == "zho_Hans");
  CHECK(nllb.source_code("zh-CN") == "zho_Hans");    // no entry: its region dropped
  CHECK(nllb.source_code("zh-TW") == "zho_Hant");    // an entry: its region changes the script
  CHECK(nllb.source_code("zh-Hant-HK") == "zho_Hant");
  CHECK(error_of([&] { nllb.source_code("fr-CA-US"); }) ==  // two regions: no tag, none dropped
        "unknown source language 'fr-CA-US': this model has fra_Latn, zho_Hans, zho_Hant");
  CHECK(error_of([&] { nllb.target_code("xx"); }) ==
        "unknown target language 'xx': this model has fra_Latn, zho_Hans, zho_Hant");
  CHECK(error_of([&] { nllb.target_code("fr-latn-x"); }) ==
        "unknown target language 'fr-latn-x': this model has fra_Latn, zho_Hans, zho_Hant");

  twostep::Languages mbart;  // two codes of one language, equally near: ambiguous
  mbart.target = {{"pt_XX", {{}, {1}}}, {"pt_BR", {{}, {2}}}};
  mbart.aliases = {{"pt", {"pt_BR", "pt_XX"}}, {"pt-br", {"pt_BR"}}, {"zh-tw", {}}};
  CHECK(error_of([&] { mbart.target_code("pt"); }) ==
        "ambiguous target language 'pt': it may be pt_BR or pt_XX; name one of them");
  CHECK(mbart.target_code("pt_BR") == "pt_BR");  // the model's own, as it is
  CHECK(mbart.target_code("pt-BR") == "pt_BR");
  CHECK(error_of([&] { mbart.target_code("zh-TW"); }) ==  // listed as none: its region is not dropped
        "unknown target language 'zh-TW': this model has pt_BR, pt_XX");
  CHECK(error_of([&] { mbart.source_code("pt"); }) ==  // the aliases name codes of either side
        "unknown source language 'pt': this model has no source languages");
}

#ifdef TWOSTEP_DEMO_TOKENIZER
TEST_CASE("tokenizer: schema 2's plain SentencePiece gives the model's own ids, eos after them") {
  Artifact a;
  a.add("tokenizer.model", read_text(TWOSTEP_DEMO_TOKENIZER));
  a.manifest["model"]["src_vocab_size"] = 256;
  a.manifest["model"]["tgt_vocab_size"] = 256;
  a.manifest["tokenizer"] = "tokenizer.model";
  a.save();
  const twostep::Tokenizer tok = twostep::Tokenizer::load(twostep::Manifest::read(a.dir));
  const twostep::Ids ids = tok.encode("three hundred and forty-two");
  CHECK(ids == twostep::Ids{28, 7, 4, 5, 12, 6, 27, 3});
  CHECK(tok.decode(ids) == "three hundred and forty-two");
  CHECK(tok.decode({2, 28, 0, 1, 7, 3}) == "three hundred");  // pad, unk, bos, eos dropped
  CHECK(tok.decode({5, 4}) == "and");                          // "and " trimmed
  CHECK(tok.decode({}) == "");
  CHECK(tok.decode({28, 256, -1}) == "three");  // ids without a piece are left out
  CHECK(error_of([&] { tok.encode(" \t"); }) == "empty input sentence");
  CHECK(error_of([&] { tok.encode("\xe3\x80\x80"); }) == "empty input sentence");  // U+3000: Python's strip()
  CHECK(error_of([&] { tok.encode(std::vector<std::string>{"three", " "}); }) == "sentence 2 is empty");
  CHECK(error_of([&] { tok.encode("three", "en"); }) ==
        "unknown source language 'en': this model has no source languages");
  CHECK(error_of([&] { tok.encode(" ", "en"); }) == "empty input sentence");  // one sentence: blank comes first
}

TEST_CASE("tokenizer: special pieces, vocab tables and languages") {
  Schema3 a(read_text(TWOSTEP_DEMO_TOKENIZER));
  const twostep::Tokenizer tok = twostep::Tokenizer::load(twostep::Manifest::read(a.dir));
  // Special pieces anywhere, the longest where two start at one place (">>fr<<" over ">>f"); the rest through
  // SentencePiece and the source table, a piece missing from it ('z', 'x') as unk_id.
  CHECK(tok.pieces("three>>fr<<hundred</s>and zzz") == twostep::Ids{10, 20, 11, 0, 12, 13, 12, 1, 1, 1});
  CHECK(tok.pieces(">>fx") == twostep::Ids{22, 12, 1});
  CHECK(tok.pieces("<pad><unk>") == twostep::Ids{2, 1});
  // Language ids first (the source's, then the target's source ids), source_suffix last.
  CHECK(tok.encode("three", "en", "fr") == twostep::Ids{30, 20, 10, 0});
  CHECK(tok.encode("three", "en", "de") == twostep::Ids{30, 21, 10, 0});
  CHECK(tok.encode(std::vector<std::string>{"three", "hundred"}, "en", "fr") ==
        std::vector<twostep::Ids>{{30, 20, 10, 0}, {30, 20, 11, 0}});
  CHECK(error_of([&] { tok.encode("three"); }) == "this model needs a source language: --src-lang one of en");
  CHECK(error_of([&] { tok.encode("three", "en"); }) ==
        "this model needs a target language: --tgt-lang one of de, fr");
  CHECK(error_of([&] { tok.encode("three", "en", "it"); }) == "unknown target language 'it': this model has de, fr");
  // The language error comes before any sentence's own.
  CHECK(error_of([&] { tok.encode(std::vector<std::string>{" "}, "xx", "fr"); }) ==
        "unknown source language 'xx': this model has en");
  // Target ids: drop_ids and ids the target table lacks left out, "▁" of unknown pieces a space, trimmed.
  CHECK(tok.decode({5, 6, 0, 55, 7, 2, 8}) == "three hundredandxyz q");
  CHECK(tok.decode({9, 5, 9}) == "three");
  CHECK(tok.decode({5, 10}) == "three");  // U+3000 trimmed, as Python's str.strip() does
}

TEST_CASE("tokenizer: detokenize argos joins the pieces as argostranslate does") {
  // twostep/runtime/tokenizer.py's Tokenizer.join: SentencePiece joins the pieces, "▁" and "_" become spaces, one
  // leading space goes and nothing else is stripped; "sentencepiece" (the default) strips both ends. The
  // expected texts are Python's.
  Schema3 a(read_text(TWOSTEP_DEMO_TOKENIZER));
  a.add("target_vocab.json", json{{"</s>", 0}, {"<pad>", 2}, {"\u2581three", 5}, {"\u2581hundred", 6}, {"and", 7},
                                  {"xyz\u2581q", 8}, {"\u2581", 9}, {"x_y", 11}}.dump());
  a.save();
  const twostep::Tokenizer plain = twostep::Tokenizer::load(twostep::Manifest::read(a.dir));
  a.manifest["tokenizer"]["detokenize"] = "argos";
  a.save();
  const twostep::Manifest m = twostep::Manifest::read(a.dir);
  CHECK(m.tokenizer->detokenize == "argos");
  const twostep::Tokenizer argos = twostep::Tokenizer::load(m);
  const std::vector<std::tuple<twostep::Ids, std::string, std::string>> cases = {
      {{9, 5, 9}, "three", "three "},
      {{5, 6, 7}, "three hundredand", "three hundredand"},
      {{8, 9}, "xyz q", "xyz q "},
      {{5, 11, 9}, "threex_y", "threex y "},
      {{9, 9}, "", ""},
  };
  for (const auto& [ids, sentencepiece, argostranslate] : cases) {
    CHECK(plain.decode(ids) == sentencepiece);
    CHECK(argos.decode(ids) == argostranslate);
  }
}

TEST_CASE("tokenizer: an unknown detokenize is one Error") {
  Schema3 a;
  a.manifest["tokenizer"]["detokenize"] = "moses";
  a.save();
  const std::string error = error_of(a.dir);
  CHECK(contains(error, "malformed manifest (tokenizer: detokenize 'moses' is not one of sentencepiece, argos)"));
  CHECK(!contains(error, "\n"));
}

TEST_CASE("alignment heads: the model's, and the decoder's alignment output that only replace_unknowns fetches") {
  Artifact a;
  twostep::Manifest m = twostep::Manifest::read(a.dir);
  CHECK((m.alignment_heads == 0 && m.alignment_layer == -1 && !m.alignment));  // absent: none
  a.manifest["model"]["alignment_heads"] = 2;
  a.manifest["model"]["alignment_layer"] = -1;
  a.manifest["graphs"]["decoder"]["outputs"].push_back(tensor("alignment", {"batch", "new_len", "src_len"}));
  a.save();
  m = twostep::Manifest::read(a.dir);
  CHECK((m.alignment_heads == 2 && m.alignment_layer == -1 && m.alignment));
  CHECK(m.decoder.outputs == std::vector<std::string>{"logits", "alignment"});
  a.manifest["model"]["alignment_heads"] = 0;  // an output the model does not have, or the other way round
  a.save();
  CHECK(contains(error_of(a.dir), "malformed manifest (model.alignment_heads is 0 but the decoder has the alignment"));
}

// --- the manifest's decoding section: the model's decoding defaults

TEST_CASE("the decoding section: an Argos package's defaults, under the options a caller gives") {
  Artifact a;
  CHECK(!twostep::Manifest::read(a.dir).decoding.beam_size);  // absent: twostep's defaults
  a.manifest["decoding"] = {{"beam_size", 4}, {"length_penalty", 0.2}, {"beam_stop", "ctranslate2"},
                            {"max_new_tokens", 256}, {"min_new_tokens", 1}, {"replace_unknowns", true}};
  a.manifest["model"]["zero_start_embedding"] = true;  // graph-only (CTranslate2's imports): nothing to read here
  a.save();
  const twostep::Manifest m = twostep::Manifest::read(a.dir);
  CHECK(m.decoding.beam_size == 4);
  CHECK(m.decoding.length_penalty == 0.2);
  CHECK(m.decoding.beam_stop == "ctranslate2");
  CHECK(m.decoding.max_new_tokens == 256);
  CHECK(m.decoding.min_new_tokens == 1);
  CHECK(m.decoding.replace_unknowns == true);
  CHECK(!m.decoding.n_best);
  CHECK(!m.samples);

  // Python's with_defaults: the defaults, each overridden by a value given, the rest twostep's.
  twostep::DecodeOptions given;
  twostep::DecodeOptions o = twostep::with_defaults(m.decoding, given);
  CHECK((o.beam_size == 4 && o.length_penalty == 0.2 && o.beam_stop == "ctranslate2" && o.max_new_tokens == 256 &&
         o.min_new_tokens == 1 && o.n_best == 1 && o.replace_unknowns == true));
  given.beam_size = 1, given.beam_stop = "n_best", given.max_new_tokens = 0;  // 0: not given, as Python's None
  given.replace_unknowns = false;  // --keep-unknowns
  o = twostep::with_defaults(m.decoding, given);
  CHECK((o.beam_size == 1 && o.beam_stop == "n_best" && o.max_new_tokens == 256 && o.length_penalty == 0.2 &&
         o.replace_unknowns == false));
  o = twostep::with_defaults({}, {});
  CHECK((o.beam_size == 1 && o.length_penalty == 1.0 && o.n_best == 1 && o.max_new_tokens == 0 &&
         o.min_new_tokens == 0 && o.beam_stop == "n_best" && o.replace_unknowns == false));
  given = {};
  given.n_best = 5, given.beam_stop = "fairseq";
  CHECK(error_of([&] { twostep::with_defaults(m.decoding, given); }) ==
        "bad decoding options: n_best must be at most the beam size 4, got 5; beam_stop must be one of n_best, "
        "transformers, transformers_early, transformers_never, ctranslate2, got 'fairseq'");

  a.manifest["decoding"] = {{"max_new_tokens", nullptr}, {"length_penalty", 1}, {"sampling", false}};  // as Python
  a.save();
  CHECK(!twostep::Manifest::read(a.dir).decoding.max_new_tokens);
  CHECK(twostep::Manifest::read(a.dir).decoding.length_penalty == 1.0);
  a.manifest["decoding"] = {{"sampling", true}, {"temperature", 0.7}};
  a.save();
  CHECK(twostep::Manifest::read(a.dir).samples);  // read; a Model refuses to decode with it
}

TEST_CASE("the decoding section: a bad one is one Error that names every problem") {
  const std::vector<std::pair<json, std::string>> cases = {
      {7, "malformed manifest ('decoding' is int, expected an object of decoding options)"},
      {{{"beam", 4}, {"beam_size", "4"}},
       "malformed manifest (decoding: unknown option 'beam'; beam_size is str '4', expected int; known options: "
       "beam_size, n_best, length_penalty, beam_stop, max_new_tokens, min_new_tokens, sampling, temperature, top_k, "
       "top_p, replace_unknowns, no_repeat_ngram_size)"},
      {{{"beam_size", true}}, "decoding: beam_size is bool True, expected int"},
      {{{"replace_unknowns", 1}}, "decoding: replace_unknowns is int 1, expected bool"},
      {{{"length_penalty", "0.2"}}, "decoding: length_penalty is str '0.2', expected float"},
      {{{"beam_size", 0}}, "decoding: bad decoding options: beam size must be an integer in [1, 256], got 0"},
      {{{"beam_stop", "fairseq"}},
       "decoding: bad decoding options: beam_stop must be one of n_best, transformers, transformers_early, "
       "transformers_never, ctranslate2, got 'fairseq'"},
      {{{"no_repeat_ngram_size", -1}},
       "decoding: bad decoding options: no_repeat_ngram_size must be an integer in [0, 1048576], got -1"},
      {{{"no_repeat_ngram_size", 2.5}}, "decoding: no_repeat_ngram_size is float 2.5, expected int"},
      {{{"beam_size", 2}, {"n_best", 3}, {"max_new_tokens", 0}, {"min_new_tokens", -1}},
       "decoding: bad decoding options: max_new_tokens must be an integer in [1, 1048576], got 0; min_new_tokens must "
       "be an integer in [0, 1048576], got -1; n_best must be at most the beam size 2, got 3"},
      {{{"sampling", true}, {"beam_size", 4}}, "sampling and beam search exclude each other: choose one"},
      {{{"temperature", 0}},
       "decoding: bad decoding options: temperature must be a finite number in [0.01, 100], got 0"},
      // Python's BOUNDS: just outside each end, as the same messages (tests/cpp checks them against Python's)
      {{{"length_penalty", 700}},
       "decoding: bad decoding options: length_penalty must be a finite number in [-10, 10], got 700"},
      {{{"length_penalty", -10.5}, {"beam_size", 257}, {"n_best", 0}},
       "decoding: bad decoding options: beam size must be an integer in [1, 256], got 257; n_best must be an integer "
       "in [1, 256], got 0; length_penalty must be a finite number in [-10, 10], got -10.5"},
      {{{"max_new_tokens", 1048577}, {"min_new_tokens", 1048577}},
       "max_new_tokens must be an integer in [1, 1048576], got 1048577; min_new_tokens must be an integer in "
       "[0, 1048576], got 1048577"},
      {{{"temperature", 100.5}, {"top_k", -1}, {"top_p", 0}},
       "temperature must be a finite number in [0.01, 100], got 100.5; top_k must be an integer in [0, 2147483647], "
       "got -1; top_p must be a finite number in (0, 1], got 0"},
      {{{"temperature", 0.0099}, {"top_k", 2147483648}, {"top_p", 1.0001}},
       "temperature must be a finite number in [0.01, 100], got 0.0099; top_k must be an integer in [0, 2147483647], "
       "got 2147483648; top_p must be a finite number in (0, 1], got 1.0001"},
      {{{"beam_size", 3000000000}}, "decoding: beam_size is 3000000000, out of range"},  // beyond int
  };
  for (const auto& [section, message] : cases) {
    Artifact a;
    a.manifest["decoding"] = section;
    a.save();
    const std::string error = error_of(a.dir);
    CHECK_MESSAGE(contains(error, message), error);
    CHECK(!contains(error, "\n"));
  }
}

TEST_CASE("the decoding section: the ends of Python's BOUNDS are read") {
  Artifact a;
  for (const json& section : {
           json{{"beam_size", 256}, {"n_best", 256}, {"length_penalty", -10}, {"max_new_tokens", 1048576},
                {"min_new_tokens", 1048576}, {"no_repeat_ngram_size", 1048576}},
           json{{"beam_size", 1}, {"n_best", 1}, {"length_penalty", 10.0}, {"max_new_tokens", 1},
                {"min_new_tokens", 0}, {"no_repeat_ngram_size", 0}, {"beam_stop", "transformers_never"}},
           json{{"temperature", 0.01}, {"top_k", 2147483647}, {"top_p", 1}},
           json{{"temperature", 100}, {"top_k", 0}, {"top_p", 1e-9}}}) {
    a.manifest["decoding"] = section;
    a.save();
    CHECK_MESSAGE(error_of(a.dir).empty(), section.dump());
  }
}

TEST_CASE("decoding options given: Python's BOUNDS, both ends taken, just outside each refused with its message") {
  using Options = twostep::DecodeOptions;
  auto with = [](const std::function<void(Options&)>& set) {
    Options o;
    set(o);
    return error_of([&] { twostep::with_defaults({}, o); });
  };
  for (const auto& set : std::vector<std::function<void(Options&)>>{
           [](Options& o) { o.beam_size = 256, o.n_best = 256, o.length_penalty = -10.0; },
           [](Options& o) { o.beam_size = 1, o.n_best = 1, o.length_penalty = 10.0; },
           [](Options& o) { o.max_new_tokens = 1048576, o.min_new_tokens = 1048576; },
           [](Options& o) { o.max_new_tokens = 1, o.min_new_tokens = 0; },
           [](Options& o) { o.no_repeat_ngram_size = 0, o.beam_stop = "transformers_early"; },
           [](Options& o) { o.no_repeat_ngram_size = 1048576; },
           [](Options& o) { o.max_new_tokens = 0; }})  // 0: automatic
    CHECK(with(set).empty());
  const std::string bad = "bad decoding options: ";
  CHECK(with([](Options& o) { o.length_penalty = 700; }) ==
        bad + "length_penalty must be a finite number in [-10, 10], got 700");
  CHECK(with([](Options& o) { o.length_penalty = 10.000001; }) ==
        bad + "length_penalty must be a finite number in [-10, 10], got 10.000001");
  CHECK(with([](Options& o) { o.length_penalty = -10.5; }) ==
        bad + "length_penalty must be a finite number in [-10, 10], got -10.5");
  CHECK(with([](Options& o) { o.length_penalty = std::nan(""); }) ==
        bad + "length_penalty must be a finite number in [-10, 10], got nan");
  CHECK(with([](Options& o) { o.length_penalty = -INFINITY; }) ==
        bad + "length_penalty must be a finite number in [-10, 10], got -inf");
  CHECK(with([](Options& o) { o.beam_size = 257, o.n_best = 0; }) ==
        bad + "beam size must be an integer in [1, 256], got 257; n_best must be an integer in [1, 256], got 0");
  CHECK(with([](Options& o) { o.beam_size = 0, o.n_best = 257; }) ==
        bad + "beam size must be an integer in [1, 256], got 0; n_best must be an integer in [1, 256], got 257");
  CHECK(with([](Options& o) { o.beam_size = 100000; }) == bad + "beam size must be an integer in [1, 256], got 100000");
  CHECK(with([](Options& o) { o.beam_size = 4, o.n_best = 5; }) ==
        bad + "n_best must be at most the beam size 4, got 5");
  CHECK(with([](Options& o) { o.max_new_tokens = 1048577, o.min_new_tokens = -1; }) ==
        bad + "max_new_tokens must be an integer in [1, 1048576] or 0 (automatic), got 1048577; min_new_tokens must "
              "be an integer in [0, 1048576], got -1");
  CHECK(with([](Options& o) { o.max_new_tokens = -1, o.min_new_tokens = 1048577; }) ==
        bad + "max_new_tokens must be an integer in [1, 1048576] or 0 (automatic), got -1; min_new_tokens must be an "
              "integer in [0, 1048576], got 1048577");
  CHECK(with([](Options& o) { o.no_repeat_ngram_size = 1048577; }) ==
        bad + "no_repeat_ngram_size must be an integer in [0, 1048576], got 1048577");
}

// TWOSTEP_TEST_ARTIFACT: a model's artifact (tests/cpp/test_cpp.py passes one; skipped without)
TEST_CASE("decoding options on a model: Model::greedy and beam_search refuse what decode_ids refuses" *
          doctest::skip(!std::getenv("TWOSTEP_TEST_ARTIFACT"))) {
  twostep::Model model = twostep::Model::load(std::getenv("TWOSTEP_TEST_ARTIFACT"), {1, "cpu"});
  const std::vector<twostep::Ids> sources = {{7, 8, 9, model.manifest().eos_id}};
  const std::string bad = "bad decoding options: ";
  CHECK(error_of([&] { model.beam_search(sources, 257, 1.0, 1, 8); }) ==
        bad + "beam size must be an integer in [1, 256], got 257");
  CHECK(error_of([&] { model.beam_search(sources, 4, 700, 1, 8); }) ==
        bad + "length_penalty must be a finite number in [-10, 10], got 700");
  CHECK(error_of([&] { model.beam_search(sources, 4, -10.5, 5, 8); }) ==
        bad + "length_penalty must be a finite number in [-10, 10], got -10.5; n_best must be at most the beam size 4, "
              "got 5");
  CHECK(error_of([&] { model.greedy(sources, 0); }) ==
        bad + "max_new_tokens must be an integer in [1, 1048576], got 0");
  CHECK(error_of([&] { model.greedy(sources, 8, false, {}, 1048577); }) ==
        bad + "min_new_tokens must be an integer in [0, 1048576], got 1048577");
  for (double length_penalty : {-10.0, 10.0}) {  // the ends: finite scores, best first
    const auto hyps = model.beam_search(sources, 4, length_penalty, 4, 8)[0];
    REQUIRE(hyps.size() == 4);
    for (size_t i = 0; i < hyps.size(); ++i)
      CHECK((std::isfinite(hyps[i].score) && (i == 0 || hyps[i].score <= hyps[i - 1].score)));
  }
  CHECK(model.beam_search(sources, 256, 1.0, 256, 2)[0].size() == 256);
}

TEST_CASE("tokenizer: trailing_space after each stretch of text that ends in whitespace") {
  // NLLB's tokenizer.json keeps such whitespace as a "▁" piece where SentencePiece drops it
  // (twostep/runtime/tokenizer.py does the same).
  Schema3 a(read_text(TWOSTEP_DEMO_TOKENIZER));
  a.manifest["tokenizer"]["trailing_space"] = {7};
  a.save();
  const twostep::Tokenizer tok = twostep::Tokenizer::load(twostep::Manifest::read(a.dir));
  CHECK(tok.pieces("three") == twostep::Ids{10});
  CHECK(tok.pieces("three ") == twostep::Ids{10, 7});
  CHECK(tok.pieces("three </s>and\t") == twostep::Ids{10, 7, 0, 12, 13, 7});
  CHECK(tok.pieces(" three") == twostep::Ids{10});
}

TEST_CASE("tokenizer: defaults, and special pieces the source table lacks") {
  Schema3 a(read_text(TWOSTEP_DEMO_TOKENIZER));
  a.manifest["tokenizer"]["languages"]["default_source"] = "en";
  a.manifest["tokenizer"]["languages"]["default_target"] = "de";
  a.manifest["tokenizer"]["special_pieces"] = {">>it<<"};  // not in the table: unk_id, like any other piece
  a.save();
  const twostep::Tokenizer tok = twostep::Tokenizer::load(twostep::Manifest::read(a.dir));
  CHECK(tok.encode("three") == twostep::Ids{30, 21, 10, 0});
  CHECK(tok.pieces(">>it<<three") == twostep::Ids{1, 10});
}

TEST_CASE("tokenizer: SentencePiece's own ids with special pieces") {
  Schema3 a(read_text(TWOSTEP_DEMO_TOKENIZER));
  a.manifest["model"]["src_vocab_size"] = 256;
  a.manifest["tokenizer"]["source_vocab"] = nullptr;
  a.manifest["tokenizer"]["special_pieces"] = {"</s>", ">>fr<<"};  // ">>fr<<": not a piece, unk
  a.manifest["tokenizer"]["languages"] = nullptr;
  a.save();
  const twostep::Tokenizer tok = twostep::Tokenizer::load(twostep::Manifest::read(a.dir));
  CHECK(tok.pieces("three</s>>>fr<<and") == twostep::Ids{28, 3, 1, 4, 5});
}
#endif

// --- the decoding loop on a scripted session: forced tokens, the start id, never_generate

namespace {
double log_softmax(const std::vector<float>& row, int64_t id) {
  double sum = 0;
  for (float x : row) sum += std::exp(static_cast<double>(x));
  return row[id] - std::log(sum);
}
}  // namespace

TEST_CASE("greedy: the start id, forced tokens, never_generate") {
  ScriptedSession session(kScript);
  const std::vector<twostep::Ids> sources = {{5, 3}, {6, 3}};
  CHECK(twostep::detail::greedy(session, sources, kSpecials, 10, false) == std::vector<twostep::Ids>{{4, 5}, {4, 5}});
  CHECK(session.fed.front() == twostep::Ids{kStart, kStart});

  // Row 0 forced to 7 first: it decodes on from there, and 7 is not output. Row 1: nothing forced.
  const std::vector<twostep::Ids> forced = {{kForced}, {}};
  CHECK(twostep::detail::greedy(session, sources, kSpecials, 10, false, forced) ==
        std::vector<twostep::Ids>{{5}, {4, 5}});
  CHECK(session.fed[1] == twostep::Ids{kForced, 4});
  // Forced tokens count against max_new_tokens.
  CHECK(twostep::detail::greedy(session, sources, kSpecials, 2, false, forced) ==
        std::vector<twostep::Ids>{{5}, {4, 5}});
  CHECK(session.fed.size() == 2);

  twostep::detail::Specials never5 = kSpecials;
  never5.never_generate = {5};
  CHECK(twostep::detail::greedy(session, sources, never5, 10, false) == std::vector<twostep::Ids>{{4, 4}, {4, 4}});
  // suppress_eos joins never_generate.
  CHECK(twostep::detail::greedy(session, {{5, 3}}, never5, 4, true) == std::vector<twostep::Ids>{{4, 4, 4, 4}});
  // Banned ids are banned on forced rows too (Python bans after forcing): every logit -inf, argmax 0.
  CHECK(twostep::detail::greedy(session, {{5, 3}}, never5, 2, false, {{5}}) == std::vector<twostep::Ids>{{4}});
  CHECK(session.fed[1] == twostep::Ids{0});
}

TEST_CASE("beam search: forced tokens score 0, count in the length, and are not output") {
  ScriptedSession session(kScript);
  const auto& s = kScript;
  const auto plain = twostep::detail::beam_search(session, {{5, 3}}, kSpecials, 2, 1.0, 1, 10, false);
  REQUIRE(plain[0].size() == 1);
  CHECK(plain[0][0].tokens == twostep::Ids{4, 5});
  CHECK(plain[0][0].score ==
        doctest::Approx((log_softmax(s[0], 4) + log_softmax(s[1], 5) + log_softmax(s[2], kEos)) / 3).epsilon(1e-12));

  const auto forced = twostep::detail::beam_search(session, {{5, 3}, {6, 3}}, kSpecials, 2, 1.0, 2, 10, false,
                                                   {{kForced}, {}});
  REQUIRE(forced[0].size() == 2);
  CHECK(forced[0][0].tokens == twostep::Ids{5});
  // The forced step adds 0 to the score and 1 to the length.
  CHECK(forced[0][0].score == doctest::Approx((log_softmax(s[1], 5) + log_softmax(s[2], kEos)) / 3).epsilon(1e-12));
  CHECK(forced[0][0].tokens != forced[0][1].tokens);
  CHECK(forced[1][0].tokens == twostep::Ids{4, 5});
  // The first step feeds the start id; the second, the forced id on the one live beam (pad on the dead one).
  CHECK(session.fed[0] == twostep::Ids{kStart, kStart, kStart, kStart});
  CHECK(session.fed[1][0] == kForced);
  CHECK(session.fed[1][1] == kPad);
}

TEST_CASE("constrained beam search: terms are tracked after the forced tokens; at the limit, unmet terms") {
  // eos is every step's best; the forced id 7 is the term, which the forced step itself does not meet
  ScriptedSession session({{0, 0, 0, 6, 1, 1, 0, -2}});
  using Ids = twostep::Ids;
  auto of = [](std::vector<std::vector<Ids>> terms) { return twostep::Constraints{std::move(terms)}; };
  const std::vector<twostep::Constraints> seven = {of({{Ids{kForced}}})};
  const auto met = twostep::detail::constrained_beam_search(session, {{5, 3}}, kSpecials, 4, 1.0, 1, {10}, false,
                                                            {{kForced}}, seven);
  REQUIRE(met[0].size() == 1);
  CHECK(met[0][0].tokens == twostep::Ids{kForced});  // generated after the forced one, then eos
  CHECK(met[0][0].unmet.empty());
  CHECK(met[0][0].score == doctest::Approx(-2.6822995130350535).epsilon(1e-12));  // Python's decode(prefixes=)
  // Room for one token after the forced one: [5, 5] cannot be held, every hypothesis says so
  const std::vector<twostep::Constraints> fives = {of({{Ids{5, 5}}, {Ids{4}}})};
  const auto unmet = twostep::detail::constrained_beam_search(session, {{5, 3}}, kSpecials, 4, 1.0, 2, {2}, false,
                                                              {{kForced}}, fives);
  REQUIRE(unmet[0].size() == 2);
  CHECK(unmet[0][0].tokens == twostep::Ids{4});  // meets term 1: before those that meet none
  CHECK(unmet[0][0].unmet == std::vector<int>{0});
  CHECK(unmet[0][1].tokens == twostep::Ids{5});  // inside [5, 5]: next
  CHECK(unmet[0][1].unmet == std::vector<int>{0, 1});
  CHECK_THROWS_WITH(twostep::detail::constrained_beam_search(session, {{5, 3}}, kSpecials, 4, 1.0, 1, {2}, false,
                                                             {}, {of({{Ids{}}})}),
                    "a constraint term needs at least one sequence of at least one token");
}

TEST_CASE("beam search: never_generate ids stay in the softmax but are never candidates") {
  ScriptedSession session(kScript);
  const auto& s = kScript;
  twostep::detail::Specials never5 = kSpecials;
  never5.never_generate = {5};
  const auto out = twostep::detail::beam_search(session, {{5, 3}}, never5, 2, 1.0, 2, 10, false);
  for (const auto& h : out[0]) CHECK(std::count(h.tokens.begin(), h.tokens.end(), 5) == 0);
  CHECK(out[0][0].tokens == twostep::Ids{4, 4});
  CHECK(out[0][0].score ==
        doctest::Approx((log_softmax(s[0], 4) + log_softmax(s[1], 4) + log_softmax(s[2], kEos)) / 3).epsilon(1e-12));
}

TEST_CASE("beam search: transformers' stopping rule keeps beam_size finished hypotheses") {
  // eos first at step 0 (just): the n_best rule stops there with the empty hypothesis; transformers' keeps
  // going, and 4 then eos, scored over two tokens, beats it.
  ScriptedSession session({{-10, -10, -10, 0, -0.1f, -10, -10, -10}, {-10, -10, -10, 10, 0, -10, -10, -10}});
  const auto& s = session.script;
  const auto n_best = twostep::detail::beam_search(session, {{5, 3}}, kSpecials, 2, 1.0, 1, 10, false);
  CHECK(n_best[0].size() == 1);
  CHECK(n_best[0][0].tokens.empty());
  CHECK(n_best[0][0].score == doctest::Approx(log_softmax(s[0], kEos)).epsilon(1e-12));
  const auto hf = twostep::detail::beam_search(session, {{5, 3}}, kSpecials, 2, 1.0, 1, 10, false, {},
                                                 twostep::detail::BeamStop::transformers);
  CHECK(hf[0].size() == 1);  // n_best of the beam_size kept
  CHECK(hf[0][0].tokens == twostep::Ids{4});
  CHECK(hf[0][0].score == doctest::Approx((log_softmax(s[0], 4) + log_softmax(s[1], kEos)) / 2).epsilon(1e-12));
}

namespace {
// Each row's logits scripted by (step, the token it was fed), uniform (all 0) elsewhere; with `width` > 0 it
// also gives the search outputs (the `width` largest logits, equal ones lower id first, and log_norm).
struct FedSession : twostep::detail::StepSession {
  std::map<std::pair<int, int64_t>, std::vector<float>> script;
  int64_t n_vocab, width;
  int t = -1;
  int64_t rows = 0;
  std::vector<float> logits, top_logits, log_norm;
  std::vector<int64_t> top_ids;

  FedSession(std::map<std::pair<int, int64_t>, std::vector<float>> s, int64_t v, int64_t w)
      : script(std::move(s)), n_vocab(v), width(w) {}
  void start(const std::vector<twostep::Ids>& sources) override { rows = sources.size(), t = -1; }
  float* step(const twostep::Ids& tokens) override {
    ++t;
    logits.assign(rows * n_vocab, 0.f);
    for (int64_t r = 0; r < rows; ++r) {
      const auto it = script.find({t, tokens[r]});
      if (it != script.end()) std::copy(it->second.begin(), it->second.end(), logits.begin() + r * n_vocab);
    }
    return logits.data();
  }
  int64_t search_width() const override { return width; }
  Search search_step(const twostep::Ids& tokens) override {
    step(tokens);
    top_logits.clear(), top_ids.clear(), log_norm.clear();
    for (int64_t r = 0; r < rows; ++r) {
      const float* x = logits.data() + r * n_vocab;
      std::vector<int64_t> order(n_vocab);
      for (int64_t v = 0; v < n_vocab; ++v) order[v] = v;
      std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return x[a] > x[b]; });
      double sum = 0;
      for (int64_t v = 0; v < n_vocab; ++v) sum += std::exp(static_cast<double>(x[v]) - x[order[0]]);
      for (int64_t j = 0; j < width; ++j) top_logits.push_back(x[order[j]]), top_ids.push_back(order[j]);
      log_norm.push_back(static_cast<float>(std::log(sum)));
    }
    return {top_logits.data(), top_ids.data(), log_norm.data()};
  }
  void expand(const std::vector<int64_t>& keep) override { rows = keep.size(); }
  void reorder(const std::vector<int64_t>&) override {}
  int64_t vocab() const override { return n_vocab; }
};
}  // namespace

TEST_CASE("beam search: transformers' rule finishes only an eos among the step's beam_size best") {
  // Beam 2. Step 1: 4, then 5. Step 2's candidates best first: [4, eos], [4, 5], [5, eos], [5, 4]: the n_best
  // rule finishes [5] (its eos comes before the second continuing candidate), transformers' does not (rank 2).
  const float low = -10;
  const std::map<std::pair<int, int64_t>, std::vector<float>> script = {
      {{0, kStart}, {low, low, 0, low, 2, 1}}, {{1, 4}, {low, low, 0, 5, low, 4.5f}}, {{1, 5}, {low, low, 0, 4, 3, low}}};
  for (int64_t width : {0, 6}) {
    CAPTURE(width);
    FedSession session(script, 6, width);
    const auto n_best = twostep::detail::beam_search(session, {{5, 3}}, kSpecials, 2, 1.0, 2, 3, false);
    REQUIRE(n_best[0].size() == 2);
    CHECK(n_best[0][0].tokens == twostep::Ids{4});
    CHECK(n_best[0][1].tokens == twostep::Ids{5});
    const auto hf = twostep::detail::beam_search(session, {{5, 3}}, kSpecials, 2, 1.0, 2, 3, false, {},
                                                   twostep::detail::BeamStop::transformers);
    REQUIRE(hf[0].size() == 2);
    CHECK(hf[0][0].tokens == twostep::Ids{4});
    CHECK(hf[0][1].tokens != twostep::Ids{5});
  }
}

TEST_CASE("beam search: transformers' early_stopping true and \"never\"") {
  // tests/runtime/decoding/test_search.py's test_transformers_early_stopping_rules. Beam 2, length_penalty 1.
  // Step 1 finishes [] (rank 1); step 2 finishes [4] (rank 1), and [4, 5] lives on. transformers_early: two
  // finished, done at step 2 with [4]. transformers: [4, 5] could still win at its length; step 3 finishes it,
  // the best, and is done. transformers_never scores the best live one at the limit: on until step 5.
  const float low = -10;
  const std::map<std::pair<int, int64_t>, std::vector<float>> script = {
      {{0, kStart}, {low, low, low, 1, 2, low}}, {{1, 4}, {low, low, low, 2, low, 2.5f}},
      {{2, 5}, {low, low, low, 5, low, 3}}};
  using twostep::detail::BeamStop;
  for (int64_t width : {0, 6}) {
    CAPTURE(width);
    FedSession session(script, 6, width);
    auto run = [&](BeamStop stop, double length_penalty) {
      const auto out = twostep::detail::beam_search(session, {{9, 3}}, kSpecials, 2, length_penalty, 1, 10, false, {},
                                                    stop)[0];
      return std::make_pair(out[0], session.t + 1);  // the best, and the steps run
    };
    const auto [early, early_steps] = run(BeamStop::transformers_early, 1.0);
    CHECK((early.tokens == twostep::Ids{4} && early_steps == 2));
    const auto [hf, hf_steps] = run(BeamStop::transformers, 1.0);
    CHECK((hf.tokens == twostep::Ids{4, 5} && hf_steps == 3));
    const auto [never, never_steps] = run(BeamStop::transformers_never, 1.0);
    CHECK((never.tokens == hf.tokens && never.score == hf.score && never_steps == 5));
    // length_penalty 0: the current length and the limit score alike
    const auto [flat, flat_steps] = run(BeamStop::transformers_never, 0.0);
    const auto [flat_hf, flat_hf_steps] = run(BeamStop::transformers, 0.0);
    CHECK((flat.tokens == flat_hf.tokens && flat_steps == flat_hf_steps));
  }
}

TEST_CASE("no_repeat_ngram_size: the start token and tokens already generated, but not a forced one") {
  // tests/runtime/decoding/test_search.py's test_no_repeat_ngram_size_bans_repeats_of_the_start_token_and_tokens_
  // but_not_a_forced_one: n = 1 bans the start token (2) and every token generated, except at a forced step; n = 2
  // ends 4 5 4 (5 would repeat 4 5). Greedy and beam 2 alike, on the logits and where the search outputs are there.
  const float low = -10;
  const std::vector<float> first = {low, low, 5, low, 1, low}, second = {low, low, low, 1, 5, low};
  const std::map<std::pair<int, int64_t>, std::vector<float>> script = {
      {{0, kStart}, first}, {{1, 4}, second}, {{1, kStart}, first}, {{2, 4}, second}};
  const std::map<std::pair<int, int64_t>, std::vector<float>> cycle = {
      {{0, kStart}, {0, 0, 0, 0, 5, 0}}, {{1, 4}, {0, 0, 0, 0, 0, 5}}, {{2, 5}, {0, 0, 0, 0, 5, 0}},
      {{3, 4}, {0, 0, 0, 4, 0, 5}}};
  using twostep::detail::BeamStop;
  for (int64_t width : {0, 6}) {
    CAPTURE(width);
    for (int beam : {1, 2}) {
      CAPTURE(beam);
      auto run = [&](const std::map<std::pair<int, int64_t>, std::vector<float>>& s, int n,
                     const std::vector<twostep::Ids>& forced, int max_new) {
        FedSession session(s, 6, width);
        if (beam == 1) return twostep::detail::greedy(session, {{9, 3}}, kSpecials, max_new, false, forced, {}, 0, n)[0];
        return twostep::detail::beam_search(session, {{9, 3}}, kSpecials, beam, 1.0, 1, max_new, false, forced,
                                            BeamStop::transformers, {}, 0, n)[0][0].tokens;
      };
      CHECK(run(script, 0, {}, 4).front() == kStart);
      CHECK(run(script, 1, {}, 4) == twostep::Ids{4});
      CHECK(run(script, 1, {{kStart}}, 4) == twostep::Ids{4});
      CHECK(run(cycle, 2, {}, 6) == twostep::Ids{4, 5, 4});
    }
  }
}

namespace {
// Python's log_softmax of `row` at `id` with the ids `out` left out of the softmax.
double log_softmax_without(const std::vector<float>& row, int64_t id, const twostep::Ids& out) {
  double sum = 0;
  for (size_t v = 0; v < row.size(); ++v)
    if (std::find(out.begin(), out.end(), static_cast<int64_t>(v)) == out.end()) sum += std::exp(double{row[v]});
  return row[id] - std::log(sum);
}
}  // namespace

TEST_CASE("beam search: CTranslate2's rule") {
  // tests/runtime/decoding/test_search.py's test_ctranslate2_rule. Beam 2; step 2's candidates best first: [4, eos],
  // [4, 5], [5, eos], [5, 4]. [4, eos] (rank 0) finishes; [5, eos] (rank 2, past the beam) finishes nothing, and
  // the next non-eos candidate past the beam, [5, 4], takes the ended slot. One finished hypothesis < beam 2: on to
  // step 3, the limit, where the two best candidates both finish without an eos ([5, 4, 0] from the refilled
  // slot). Scores: log-probability / length ** penalty, the length counting the eos.
  using twostep::detail::BeamStop;
  const float low = -10;
  const std::vector<float> first = {low, low, 0, low, 2, 1}, after4 = {low, low, 0, 5, low, 4.5f};
  const std::map<std::pair<int, int64_t>, std::vector<float>> script = {
      {{0, kStart}, first}, {{1, 4}, after4}, {{1, 5}, {low, low, 0, 4, 3, low}}, {{2, 4}, {6, 0, 0, 0, 0, 0}}};
  const double step1 = log_softmax(first, 4), step2 = log_softmax(after4, kEos);
  for (int64_t width : {0, 6}) {  // the logits, and the search outputs
    CAPTURE(width);
    FedSession session(script, 6, width);
    auto run = [&](double penalty, int n_best, int max_new) {
      return twostep::detail::beam_search(session, {{9, 3}}, kSpecials, 2, penalty, n_best, max_new, false, {},
                                          BeamStop::ctranslate2)[0];
    };
    auto hyps = run(1.0, 2, 3);
    REQUIRE(hyps.size() == 2);
    CHECK(hyps[0].tokens == twostep::Ids{4});
    CHECK(hyps[1].tokens == twostep::Ids{5, 4, 0});
    CHECK(session.t + 1 == 3);
    CHECK(hyps[0].score == doctest::Approx((step1 + step2) / 2).epsilon(1e-6));
    CHECK(hyps[1].score < hyps[0].score);
    // the n_best rule finishes [5] at rank 2
    const auto n_best = twostep::detail::beam_search(session, {{9, 3}}, kSpecials, 2, 1.0, 2, 3, false);
    REQUIRE(n_best[0].size() == 2);
    CHECK(n_best[0][1].tokens == twostep::Ids{5});
    // length_penalty 0: done once the best candidate has ended and n_best (1) are finished: at step 2
    hyps = run(0.0, 1, 10);
    REQUIRE(hyps.size() == 1);
    CHECK(hyps[0].tokens == twostep::Ids{4});
    CHECK(hyps[0].score == doctest::Approx(step1 + step2).epsilon(1e-6));
    CHECK(session.t + 1 == 2);
    run(1.0, 1, 10);
    CHECK(session.t + 1 > 2);  // one finished hypothesis, not the beam's two: on it goes
  }
  // both of step 2's best candidates end: beam 2 finished hypotheses, done there, far from the limit
  const std::vector<float> ends = {low, low, 0, 8, low, low};
  FedSession session({{{0, kStart}, first}, {{1, 4}, ends}, {{1, 5}, ends}}, 6, 0);
  const auto hyps = twostep::detail::beam_search(session, {{9, 3}}, kSpecials, 2, 1.0, 2, 10, false, {},
                                                 BeamStop::ctranslate2)[0];
  REQUIRE(hyps.size() == 2);
  CHECK(hyps[0].tokens == twostep::Ids{4});
  CHECK(hyps[1].tokens == twostep::Ids{5});
  CHECK(session.t + 1 == 2);
}

TEST_CASE("beam search: CTranslate2's rule takes never_generate ids out of the softmax") {
  // A never-generated id is no candidate under every rule; under CTranslate2's it is out of the normaliser too
  // (DisableTokens), so the scores differ from the n_best rule's by exactly that.
  const std::vector<float> row = {0, 0, 0, 1, 4, 3, 0, 0};
  twostep::detail::Specials never5 = kSpecials;
  never5.never_generate = {5};
  for (int64_t width : {0, 8}) {  // the search outputs cannot say what leaving 5 out changes: the logits are used
    CAPTURE(width);
    FedSession session({{{0, kStart}, row}, {{1, 4}, {0, 0, 0, 9, 0, 0, 0, 0}}}, 8, width);
    const auto ct2 = twostep::detail::beam_search(session, {{9, 3}}, never5, 2, 0.0, 1, 10, false, {},
                                                  twostep::detail::BeamStop::ctranslate2)[0];
    REQUIRE(ct2.size() == 1);
    CHECK(ct2[0].tokens == twostep::Ids{4});
    const std::vector<float> second = {0, 0, 0, 9, 0, 0, 0, 0};
    CHECK(ct2[0].score ==
          doctest::Approx(log_softmax_without(row, 4, {5}) + log_softmax_without(second, kEos, {5})).epsilon(1e-6));
    CHECK(std::abs(ct2[0].score - (log_softmax(row, 4) + log_softmax(second, kEos))) > 1e-3);
    const auto plain = twostep::detail::beam_search(session, {{9, 3}}, never5, 2, 0.0, 1, 10, false)[0];
    CHECK(plain[0].score == doctest::Approx(log_softmax(row, 4) + log_softmax(second, kEos)).epsilon(1e-6));
  }
}

TEST_CASE("min_new_tokens takes eos out of the first steps") {
  // tests/runtime/decoding/test_search.py's test_min_new_tokens_takes_eos_out_of_the_first_steps: eos is no
  // candidate, and out of the softmax, until min_new_tokens are generated (CTranslate2's min_decoding_length).
  const std::vector<float> first = {0, 0, 0, 9, 1, 0}, second = {0, 0, 0, 9, 0, 0};
  const std::map<std::pair<int, int64_t>, std::vector<float>> script = {{{0, kStart}, first}, {{1, 4}, second}};
  for (int64_t width : {0, 6}) {
    CAPTURE(width);
    FedSession session(script, 6, width);
    auto beam = [&](int min_new) {
      return twostep::detail::beam_search(session, {{9, 3}}, kSpecials, 2, 0.0, 1, 5, false, {},
                                          twostep::detail::BeamStop::ctranslate2, {}, min_new)[0];
    };
    CHECK(beam(0)[0].tokens.empty());
    const auto hyps = beam(1);
    CHECK(hyps[0].tokens == twostep::Ids{4});
    const double want = (1.0 - std::log(std::exp(1.0) + 4)) + (9.0 - std::log(std::exp(9.0) + 5));
    CHECK(hyps[0].score == doctest::Approx(want).epsilon(1e-6));
    for (const auto& [min_new, tokens] : std::vector<std::pair<int, twostep::Ids>>{{0, {}}, {1, {4}}})
      CHECK(twostep::detail::greedy(session, {{9, 3}}, kSpecials, 5, false, {}, {}, min_new)[0] == tokens);
    // Forced tokens count: with one forced, min_new_tokens 1 is already met at the next step, and eos ends it.
    CHECK(twostep::detail::greedy(session, {{9, 3}}, kSpecials, 5, false, {{4}}, {}, 1)[0].empty());
  }
}

TEST_CASE("beam search on the search outputs: suppressed eos and never_generate ids in a row's top are skipped") {
  // eos is every row's best, 5 its second: suppressed, neither is ever chosen, and every hypothesis runs to
  // max_new_tokens (4 on the logits path; the search outputs must agree).
  std::map<std::pair<int, int64_t>, std::vector<float>> script;
  for (int t = 0; t < 4; ++t)
    for (int64_t fed : {kStart, kPad, int64_t{4}, int64_t{6}, int64_t{7}}) script[{t, fed}] = {0, 0, 0, 9, 1, 8, 2, 1};
  twostep::detail::Specials never5 = kSpecials;
  never5.never_generate = {5};
  std::vector<std::vector<twostep::Hypothesis>> runs;
  for (int64_t width : {0, 8}) {
    CAPTURE(width);
    FedSession session(script, 8, width);
    auto out = twostep::detail::beam_search(session, {{5, 3}}, never5, 2, 1.0, 2, 4, true);
    REQUIRE(out[0].size() == 2);
    for (const auto& h : out[0]) {
      CHECK(h.tokens.size() == 4);
      CHECK(std::count(h.tokens.begin(), h.tokens.end(), 5) == 0);
    }
    runs.push_back(out[0]);
  }
  for (size_t i = 0; i < 2; ++i) {
    CHECK(runs[1][i].tokens == runs[0][i].tokens);
    CHECK(runs[1][i].score == doctest::Approx(runs[0][i].score).epsilon(1e-6));
  }
}

TEST_CASE("cuda provider options: device 0, TF32 off") {
  // What provider "cuda" gives OrtCUDAProviderOptionsV2, each key once: without use_tf32=0 the provider runs
  // fp32 MatMuls in TF32 (its default), ~1e-3 off what the artifact was validated in.
  using Options = std::vector<std::pair<std::string, std::string>>;
  CHECK(twostep::detail::cuda_provider_options() == Options{{"device_id", "0"}, {"use_tf32", "0"}});
}
