// Unit tests of the manifest reader (and the numpy-compatible sum), on small artifact directories made here.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <unistd.h>

#include "decoding.h"
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
};

std::string error_of(const fs::path& dir) {
  try {
    twostep::Manifest::read(dir);
  } catch (const twostep::Error& e) {
    return e.what();
  }
  return "";
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
  CHECK(m.tokenizer.empty());
  CHECK(m.n_heads == 4);
  CHECK(m.head_dim_k == 8);
  CHECK(m.head_dim_v == 6);
  CHECK(m.decoder.file == "decoder.onnx");
  CHECK(m.decoder.inputs == std::vector<std::string>{"input_ids", "encoder_attention_mask", "past_lengths",
                                                     "past_key_self_0", "past_value_self_0"});
  CHECK(m.encoder.outputs.size() == 2);
  CHECK(m.files.size() == 2);
}

TEST_CASE("wrong schema version") {
  Artifact a;
  a.manifest["schema_version"] = 3;
  a.save();
  const std::string e = error_of(a.dir);
  CHECK(contains(e, "manifest.json: schema version 3, this twostep reads version 2"));
}

TEST_CASE("an artifact of the older schema asks to be re-exported") {
  Artifact a;
  a.manifest["schema_version"] = 1;
  a.save();
  const std::string e = error_of(a.dir);
  CHECK(contains(e, "manifest.json: schema version 1, exported by an older twostep"));
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
