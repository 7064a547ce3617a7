// The step sessions the decoding loop runs (decoding.h's StepSession) over ONNX Runtime, and the ONNX Runtime
// helpers they and Model share. Internal header: every file that includes ONNX Runtime's C++ API includes it
// through this one, with its API initialised by hand (init_ort).
#pragma once

#define ORT_API_MANUAL_INIT
#include <onnxruntime_cxx_api.h>
#undef ORT_API_MANUAL_INIT

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "decoding.h"
#include "twostep/twostep.h"

namespace twostep::detail {

// Once, before any other ONNX Runtime call: the headers' C API version must be one the library serves.
void init_ort();

size_t element_size(ONNXTensorElementDataType type);

// Runs f, turning ONNX Runtime's exceptions into twostep::Error.
template <typename F>
auto ort_errors(const std::string& what, F&& f) {
  try {
    return f();
  } catch (const Ort::Exception& e) {
    throw Error(what + ": ONNX Runtime error: " + e.what());
  }
}

// The plain decoder's session (decoder.onnx): each step's present self-attention K/V (past_len + 1 positions)
// become the next step's past. The decoding loop feeds every row at one position.
//
// Where the decoder's state lives between steps. Host (provider cpu): Session::Run on host tensors, rows
// gathered with memcpy. Bound (provider cuda, or Options::io_binding on the CPU, which runs the same code so
// that tests hold it): Ort::IoBinding keeps the self cache and cross K/V in the provider's memory, each
// step's presents stay there as the next step's past, and Gather sessions move beam rows there; per step
// only the token ids go in and the logits come out.
class PlainSession : public StepSession {
 public:
  // Opens the encoder and `decoder`, a graph with the plain decoder's inputs and outputs (the manifest's, or a
  // variant's: InplaceSession).
  PlainSession(Ort::Env& env, const Manifest& m, const Manifest::Graph& decoder, const Options& options);

  void start(const std::vector<Ids>& sources) override;
  float* step(const Ids& tokens) override;
  Search search_step(const Ids& tokens) override;
  void expand(const std::vector<int64_t>& rows) override;
  void reorder(const std::vector<int64_t>& rows) override;
  int64_t vocab() const override { return m.tgt_vocab_size; }
  int64_t search_width() const override { return searches ? m.search_width : 0; }

  // The decoder's alignment output (Manifest::alignment) for `targets` fed at once from the start on `source`, on an
  // empty cache of its own: (targets.size() x source.size()) float32, row-major, row t the source attention of the
  // step that predicts the token after targets[t]. Its own tensors and a plain Run that asks for the alignment
  // alone: the batch being decoded stays as it is. Python: RowSession.alignment.
  std::vector<float> alignment(const Ids& source, const Ids& targets);

 protected:
  Ort::Value tensor(const std::vector<int64_t>& shape, ONNXTensorElementDataType type);
  // Rows `rows` of a tensor along axis 0, copied into a new tensor (bound: by a Gather where it lives).
  Ort::Value gather(const Ort::Value& value, const std::vector<int64_t>& rows);
  // A float output as float32: its own data, or (float16 graphs) widened into `widened`.
  float* floats(Ort::Value& value, std::vector<float>& widened);
  void check_positions(int64_t positions) const;
  // The self-attention cache's positions on an empty cache fed `new_len` tokens at once: the plain decoder's past
  // is empty, the in-place decoder's buffer holds them.
  virtual int64_t empty_capacity(int64_t new_len) const { (void)new_len; return 0; }

  const Manifest& m;
  std::string graph;  // the decoder's name, for errors
  Ort::Session encoder{nullptr}, decoder{nullptr};
  Ort::AllocatorWithDefaultOptions alloc;
  ONNXTensorElementDataType float_type = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  std::vector<const char*> enc_in, enc_out, dec_in, dec_out;  // dec_out: a step's, without the alignment
  // The decoder's outputs but the logits, and where the search outputs are among them (Manifest::search_width).
  bool searches = false;
  std::vector<const char*> dec_out_search;
  size_t top_logits_out = 0, top_ids_out = 0, log_norm_out = 0;
  size_t enc_ids = 0, ids_slot = 0, mask_slot = 0, lengths_slot = 0, logits_out = 0;  // lengths: past_lengths
  std::vector<std::pair<size_t, size_t>> self_slots;   // (decoder input past_*_self_i, decoder output present_*)
  std::vector<std::pair<size_t, size_t>> cross_slots;  // (decoder input past_*_cross_i, encoder output present_*)

  bool bound = false;
  Ort::MemoryInfo state_memory{nullptr}, host_memory{nullptr};
  Ort::Session gather_float{nullptr}, gather_int64{nullptr};

  // The batch being decoded: the decoder's inputs (in dec_in order), the last logits, the cache length.
  std::vector<Ort::Value> feeds;
  Ort::Value logits{nullptr};
  std::vector<float> logits_f32;  // float16 graphs: logits widened to float32
  std::vector<Ort::Value> search_values;  // the last search_step's outputs
  std::vector<float> top_f32, norm_f32;  // float16 graphs: search outputs widened
  int64_t rows = 0, past_len = 0;

 private:
  Ort::Session open_gather(Ort::Env& env, const Options& options, ONNXTensorElementDataType type);
  std::vector<Ort::Value> run(Ort::Session& session, const char* graph, const std::vector<const char*>& in,
                              const Ort::Value* values, const std::vector<const char*>& out,
                              const std::vector<const char*>& to_host = {});
  std::vector<Ort::Value> feed(const Ids& tokens, const std::vector<const char*>& outputs,
                               const std::vector<const char*>& to_host, size_t shift);
};

}  // namespace twostep::detail
