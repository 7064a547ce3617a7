// twostep for C++: load an artifact directory (encoder.onnx + decoder.onnx + manifest.json + tokenizer.model)
// and decode with ONNX Runtime, with the same results as the Python runtime (twostep/runtime/).
//
//   auto model = twostep::Model::load("artifacts/demo", {/*threads*/ 2, "cpu"});
//   twostep::DecodeOptions opts;  opts.beam_size = 4;
//   std::vector<std::string> out = model.translate({"three hundred and forty-two"}, opts);
//
// Every failure is a twostep::Error whose message names what was wrong (file, graph, sentence).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace twostep {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

using Ids = std::vector<int64_t>;

// Lowercase hex SHA-256 of a file (the digests in manifest["files"]).
std::string sha256_file(const std::filesystem::path& path);

// What manifest.json says; read() checks the format, schema version and every file's sha256.
struct Manifest {
  std::filesystem::path dir;
  int64_t src_vocab_size = 0, tgt_vocab_size = 0, max_positions = 0;
  int64_t pad_id = 0, unk_id = 1, bos_id = 2, eos_id = 3;
  std::string dtype;                          // the graphs' float I/O: "float32" or "float16"
  std::string tokenizer;                      // file name in dir, empty when the model has none
  std::map<std::string, std::string> files;   // name -> sha256
  struct Graph {
    std::string file;
    std::vector<std::string> inputs, outputs;  // names, in the manifest's order
  } encoder, decoder;
  int64_t n_heads = 0, head_dim_k = 0, head_dim_v = 0;  // from the decoder's past_key_self_0 / past_value_self_0

  // Reads manifest.json and checks it: format, schema version, sizes, every file the runtime opens listed
  // with its sha256, every listed name a plain relative path that stays inside dir (symbolic links too),
  // and (check_hashes) every listed file's sha256.
  static Manifest read(const std::filesystem::path& dir, bool check_hashes = true);
  // The graphs' ONNX external data must be listed files too (Model::load checks it before opening them).
  void check_external_data() const;
};

// The files an ONNX graph keeps tensors in (external data "location"s), found without reading tensor data.
std::set<std::string> external_data_locations(const std::filesystem::path& graph_file);

struct Options {
  int threads = 0;               // intra-op threads; 0: ONNX Runtime's default
  std::string provider = "cpu";  // "cpu" or "cuda" (fp32 MatMuls with TF32 off, like the Python ort-cuda)
  // Keep the KV cache and cross K/V in the provider's memory between steps (Ort::IoBinding, rows reordered
  // there). Always on with "cuda"; with "cpu" it runs the same code path, which is how it is tested here.
  bool io_binding = false;
};

struct DecodeOptions {
  int beam_size = 1;  // 1: greedy
  double length_penalty = 1.0;
  int n_best = 1;
  int max_new_tokens = 0;  // 0: min(max_positions, 2 * longest source in the batch + 16)
  bool suppress_eos = false;  // never pick eos (fixed-length decoding, for benchmarks)
  int batch_size = 32;        // sentences are sorted by length and decoded this many at a time
};

struct Hypothesis {
  Ids tokens;    // without bos and eos
  double score;  // beam search: sum of log-probs / length ** length_penalty; greedy: 0
};

// One artifact, loaded: its two ONNX Runtime sessions and tokenizer. A Model decodes one call at a time; use
// one Model per thread.
class Model {
 public:
  static Model load(const std::filesystem::path& dir, const Options& options = {});
  Model(Model&&) noexcept;
  Model& operator=(Model&&) noexcept;
  ~Model();

  const Manifest& manifest() const;

  // One batch as given (no sorting, no input checks beyond the model's limits).
  std::vector<Ids> greedy(const std::vector<Ids>& sources, int max_new_tokens, bool suppress_eos = false);
  std::vector<std::vector<Hypothesis>> beam_search(const std::vector<Ids>& sources, int beam_size,
                                                   double length_penalty, int n_best, int max_new_tokens,
                                                   bool suppress_eos = false);

  // Token ids in (each ending with eos), best hypotheses out, in input order: sorted into batches like the
  // Python Translator, ids checked against the vocabulary and max_positions.
  std::vector<std::vector<Hypothesis>> decode_ids(const std::vector<Ids>& sources, const DecodeOptions& options = {});
  std::vector<Ids> translate_ids(const std::vector<Ids>& sources, const DecodeOptions& options = {});

  // Text in, text out, with the artifact's tokenizer.model.
  Ids encode(const std::string& text) const;  // pieces + eos
  std::vector<Ids> encode(const std::vector<std::string>& texts) const;  // errors name the sentence
  std::string decode(const Ids& ids) const;   // special ids dropped
  std::vector<std::string> translate(const std::vector<std::string>& texts, const DecodeOptions& options = {});

 private:
  struct Impl;
  explicit Model(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace twostep
