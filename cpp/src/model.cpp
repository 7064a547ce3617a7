// Model: the two ONNX Runtime sessions, the decoder's state between steps, and the Translator's batching
// (twostep/runtime/translator.py); text goes through its Tokenizer (tokenizer.cpp).
#define ORT_API_MANUAL_INIT
#include <onnxruntime_cxx_api.h>
#undef ORT_API_MANUAL_INIT

#include <algorithm>
#include <cstring>
#include <memory>
#include <numeric>
#include <set>
#include <string>

#include "decoding.h"
#include "providers.h"
#include "stream.h"
#include "twostep/twostep.h"

namespace twostep {
namespace fs = std::filesystem;

std::vector<std::pair<std::string, std::string>> detail::cuda_provider_options() {
  return {{"device_id", "0"}, {"use_tf32", "0"}};
}

namespace {
// The headers' C API version must be one the library serves (a newer library serves every older version).
void init_ort() {
  static const bool done = [] {
    const OrtApi* api = OrtGetApiBase()->GetApi(ORT_API_VERSION);
    if (!api)
      throw Error(std::string("the ONNX Runtime library (") + OrtGetApiBase()->GetVersionString() +
                  ") is older than the headers twostep was built with (C API version " +
                  std::to_string(ORT_API_VERSION) + ")");
    Ort::InitApi(api);
    return true;
  }();
  (void)done;
}

// Runs f, turning ONNX Runtime's exceptions into twostep::Error.
template <typename F>
auto ort_errors(const std::string& what, F&& f) {
  try {
    return f();
  } catch (const Ort::Exception& e) {
    throw Error(what + ": ONNX Runtime error: " + e.what());
  }
}

size_t element_size(ONNXTensorElementDataType type) {
  switch (type) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: return 4;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: return 2;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64: return 8;
    default: throw Error("unexpected tensor element type " + std::to_string(type));
  }
}

size_t index_of(const std::vector<std::string>& names, const std::string& name, const std::string& graph) {
  auto it = std::find(names.begin(), names.end(), name);
  if (it == names.end()) throw Error(graph + " graph: the manifest lists no tensor " + name);
  return static_cast<size_t>(it - names.begin());
}

std::vector<const char*> c_strs(const std::vector<std::string>& names) {
  std::vector<const char*> out;
  for (const auto& n : names) out.push_back(n.c_str());
  return out;
}

// The graph file's own inputs and outputs must be the manifest's, as sets (a manifest that leaves out a cache
// input would otherwise fail deep inside a run).
void check_io(Ort::Session& session, const Manifest::Graph& graph, const std::string& name) {
  Ort::AllocatorWithDefaultOptions alloc;
  std::set<std::string> inputs, outputs;
  for (size_t i = 0; i < session.GetInputCount(); ++i) inputs.insert(session.GetInputNameAllocated(i, alloc).get());
  for (size_t i = 0; i < session.GetOutputCount(); ++i) outputs.insert(session.GetOutputNameAllocated(i, alloc).get());
  if (inputs != std::set<std::string>(graph.inputs.begin(), graph.inputs.end()) ||
      outputs != std::set<std::string>(graph.outputs.begin(), graph.outputs.end()))
    throw Error(name + " graph: its inputs and outputs are not those manifest.json lists; re-export the artifact");
}

void check_beam_stop(const std::string& rule) {
  if (rule != "n_best" && rule != "transformers")
    throw Error("beam_stop must be one of n_best, transformers, got '" + rule + "'");
}

Ort::SessionOptions session_options(const Options& o) {
  if (o.threads < 0) throw Error("threads must be 0 (ONNX Runtime's default) or more, got " + std::to_string(o.threads));
  Ort::SessionOptions so;
  so.SetGraphOptimizationLevel(GraphOptimizationLevel::ORT_ENABLE_ALL);
  if (o.threads > 0) so.SetIntraOpNumThreads(o.threads).SetInterOpNumThreads(1);
  so.SetLogSeverityLevel(3);
  if (o.provider == "cuda") {
    const auto have = Ort::GetAvailableProviders();
    if (std::find(have.begin(), have.end(), "CUDAExecutionProvider") == have.end()) {
      std::string list;
      for (const auto& p : have) list += (list.empty() ? "" : ", ") + p;
      throw Error("provider cuda: this ONNX Runtime build has no CUDAExecutionProvider (it has " + list +
                  "); link a GPU build: cpp/fetch_deps.sh with PYTHON set to an interpreter that has "
                  "onnxruntime-gpu, or configure with -DONNXRUNTIME_ROOT=<a GPU release of ONNX Runtime>");
    }
    // The V2 options, for use_tf32 (detail::cuda_provider_options).
    ort_errors("provider cuda", [&] {
      const OrtApi& api = Ort::GetApi();
      OrtCUDAProviderOptionsV2* cuda = nullptr;
      Ort::ThrowOnError(api.CreateCUDAProviderOptions(&cuda));
      std::unique_ptr<OrtCUDAProviderOptionsV2, void (*)(OrtCUDAProviderOptionsV2*)> owned(
          cuda, [](OrtCUDAProviderOptionsV2* p) { Ort::GetApi().ReleaseCUDAProviderOptions(p); });
      const auto options = detail::cuda_provider_options();
      std::vector<const char*> keys, values;
      for (const auto& [key, value] : options) {
        keys.push_back(key.c_str());
        values.push_back(value.c_str());
      }
      Ort::ThrowOnError(api.UpdateCUDAProviderOptions(cuda, keys.data(), values.data(), keys.size()));
      so.AppendExecutionProvider_CUDA_V2(*cuda);
    });
  } else if (o.provider != "cpu") {
    throw Error("unknown provider '" + o.provider + "': expected cpu or cuda");
  }
  return so;
}

// A minimal ONNX model, protobuf-encoded by hand (no protobuf library needed): out = Gather(data, indices,
// axis=0) for one element type and any rank. Beam search's row gathers run it where the cache lives.
namespace onnx_pb {
void varint(std::string& out, uint64_t v) {
  for (; v >= 0x80; v >>= 7) out += static_cast<char>(v | 0x80);
  out += static_cast<char>(v);
}
void field(std::string& out, int number, uint64_t value) {  // wire type 0: varint
  varint(out, static_cast<uint64_t>(number) << 3);
  varint(out, value);
}
void field(std::string& out, int number, const std::string& bytes) {  // wire type 2: length-delimited
  varint(out, (static_cast<uint64_t>(number) << 3) | 2);
  varint(out, bytes.size());
  out += bytes;
}
std::string value_info(const std::string& name, int elem_type) {  // ValueInfoProto, no shape: any rank
  std::string tensor, type, info;
  field(tensor, 1, elem_type);  // TypeProto.Tensor.elem_type
  field(type, 1, tensor);       // TypeProto.tensor_type
  field(info, 1, name);
  field(info, 2, type);
  return info;
}
}  // namespace onnx_pb

// IR version 7 and opset 13 (Gather has not changed since): older than any exported graph, so every ONNX
// Runtime that runs the artifact runs this too.
std::string gather_model(ONNXTensorElementDataType elem_type) {
  using onnx_pb::field;
  std::string axis, node, graph, opset, model;
  field(axis, 1, std::string("axis"));
  field(axis, 3, uint64_t{0});   // i
  field(axis, 20, uint64_t{2});  // type INT
  for (const char* in : {"data", "indices"}) field(node, 1, std::string(in));
  field(node, 2, std::string("out"));
  field(node, 4, std::string("Gather"));
  field(node, 5, axis);
  field(graph, 1, node);
  field(graph, 2, std::string("reorder"));
  field(graph, 11, onnx_pb::value_info("data", elem_type));
  field(graph, 11, onnx_pb::value_info("indices", ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64));
  field(graph, 12, onnx_pb::value_info("out", elem_type));
  field(opset, 1, std::string());
  field(opset, 2, uint64_t{13});
  field(model, 1, uint64_t{7});  // ir_version
  field(model, 7, graph);
  field(model, 8, opset);
  return model;
}
}  // namespace

struct Model::Impl final : detail::StepSession {
  static std::unique_ptr<Impl> load(const fs::path& dir, const Options& options);

  Manifest m;
  Ort::Env env{ORT_LOGGING_LEVEL_WARNING, "twostep"};
  Ort::Session encoder{nullptr}, decoder{nullptr};
  Ort::AllocatorWithDefaultOptions alloc;
  ONNXTensorElementDataType float_type = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  std::optional<Tokenizer> tokenizer;
  std::vector<const char*> enc_in, enc_out, dec_in, dec_out;
  // The decoder's outputs but the logits, and where the search outputs are among them (Manifest::search_width).
  std::vector<const char*> dec_out_search;
  size_t top_logits_out = 0, top_ids_out = 0, log_norm_out = 0;
  size_t enc_ids = 0, ids_slot = 0, mask_slot = 0, lengths_slot = 0, logits_out = 0;  // lengths: past_lengths
  std::vector<std::pair<size_t, size_t>> self_slots;   // (decoder input past_*_self_i, decoder output present_*)
  std::vector<std::pair<size_t, size_t>> cross_slots;  // (decoder input past_*_cross_i, encoder output present_*)

  // Where the decoder's state lives between steps. Host (provider cpu): Session::Run on host tensors, rows
  // gathered with memcpy. Bound (provider cuda, or Options::io_binding on the CPU, which runs the same code so
  // that tests hold it): Ort::IoBinding keeps the self cache and cross K/V in the provider's memory, each
  // step's presents stay there as the next step's past, and Gather sessions move beam rows there; per step
  // only the token ids go in and the logits come out.
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

  Ort::Session open(const Options& options, const std::string& file) {
    const fs::path path = m.dir / file;
    try {
      return Ort::Session(env, path.c_str(), session_options(options));
    } catch (const Ort::Exception& e) {
      throw Error(path.string() + ": ONNX Runtime cannot load it: " + e.what());
    }
  }

  Ort::Session open_gather(const Options& options, ONNXTensorElementDataType type) {
    const std::string model = gather_model(type);
    return ort_errors("the beam reorder Gather", [&] {
      return Ort::Session(env, model.data(), model.size(), session_options(options));
    });
  }

  // One graph run; bound, every output stays in state_memory except those `to_host` (the logits, or the search
  // outputs).
  std::vector<Ort::Value> run(Ort::Session& session, const char* graph, const std::vector<const char*>& in,
                              const Ort::Value* values, const std::vector<const char*>& out,
                              const std::vector<const char*>& to_host = {}) {
    return ort_errors(std::string(graph) + " graph", [&] {
      if (!bound) return session.Run(Ort::RunOptions{nullptr}, in.data(), values, in.size(), out.data(), out.size());
      Ort::IoBinding binding(session);
      for (size_t i = 0; i < in.size(); ++i) binding.BindInput(in[i], values[i]);
      for (const char* name : out) {
        const bool host = std::any_of(to_host.begin(), to_host.end(),
                                      [&](const char* h) { return std::strcmp(name, h) == 0; });
        binding.BindOutput(name, host ? host_memory : state_memory);
      }
      session.Run(Ort::RunOptions{nullptr}, binding);
      binding.SynchronizeOutputs();
      return binding.GetOutputValues();
    });
  }

  Ort::Value tensor(const std::vector<int64_t>& shape, ONNXTensorElementDataType type) {
    return Ort::Value::CreateTensor(alloc, shape.data(), shape.size(), type);
  }

  // Rows `rows` of a tensor along axis 0, copied into a new tensor (bound: by a Gather where it lives).
  Ort::Value gather(const Ort::Value& value, const std::vector<int64_t>& rows) {
    const auto info = value.GetTensorTypeAndShapeInfo();
    if (bound) {
      Ort::Value indices = tensor({static_cast<int64_t>(rows.size())}, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64);
      std::copy(rows.begin(), rows.end(), indices.GetTensorMutableData<int64_t>());
      Ort::Session& session = info.GetElementType() == ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64 ? gather_int64 : gather_float;
      return ort_errors("beam reorder", [&] {
        Ort::IoBinding binding(session);
        binding.BindInput("data", value);
        binding.BindInput("indices", indices);
        binding.BindOutput("out", state_memory);
        session.Run(Ort::RunOptions{nullptr}, binding);
        auto out = binding.GetOutputValues();
        return std::move(out[0]);
      });
    }
    std::vector<int64_t> shape = info.GetShape();
    const size_t row_bytes = element_size(info.GetElementType()) * (info.GetElementCount() / shape[0]);
    shape[0] = static_cast<int64_t>(rows.size());
    Ort::Value out = tensor(shape, info.GetElementType());
    if (row_bytes == 0) return out;
    const auto* src = static_cast<const char*>(value.GetTensorRawData());
    auto* dst = static_cast<char*>(out.GetTensorMutableRawData());
    for (size_t i = 0; i < rows.size(); ++i) std::memcpy(dst + i * row_bytes, src + rows[i] * row_bytes, row_bytes);
    return out;
  }

  int64_t vocab() const override { return m.tgt_vocab_size; }

  void start(const std::vector<Ids>& sources) override {
    size_t width = 0;
    for (const auto& s : sources) width = std::max(width, s.size());
    if (sources.empty() || std::any_of(sources.begin(), sources.end(), [](const Ids& s) { return s.empty(); }))
      throw Error("empty input: every sentence needs at least one token");
    if (static_cast<int64_t>(width) > m.max_positions)
      throw Error("encoder: source of " + std::to_string(width) + " tokens, the model takes at most " +
                  std::to_string(m.max_positions) + " (max_positions)");
    rows = static_cast<int64_t>(sources.size());
    const std::vector<int64_t> shape{rows, static_cast<int64_t>(width)};
    Ort::Value enc_feeds[2] = {tensor(shape, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64),
                               tensor(shape, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64)};
    int64_t* ids = enc_feeds[enc_ids].GetTensorMutableData<int64_t>();
    int64_t* mask = enc_feeds[1 - enc_ids].GetTensorMutableData<int64_t>();
    for (int64_t b = 0; b < rows; ++b)
      for (size_t i = 0; i < width; ++i) {
        const bool real = i < sources[b].size();
        const int64_t id = real ? sources[b][i] : m.pad_id;
        if (id < 0 || id >= m.src_vocab_size)
          throw Error("encoder.input_ids: token ids outside the vocabulary [0, " + std::to_string(m.src_vocab_size) + ")");
        ids[b * width + i] = id;
        mask[b * width + i] = real;
      }
    auto enc = run(encoder, "encoder", enc_in, enc_feeds, enc_out);
    feeds.clear();
    for (size_t i = 0; i < dec_in.size(); ++i) feeds.emplace_back(nullptr);
    feeds[mask_slot] = std::move(enc_feeds[1 - enc_ids]);
    for (const auto& [in, out] : cross_slots) feeds[in] = std::move(enc[out]);
    for (const auto& [in, out] : self_slots) {  // zero-length past: the first step
      const bool key = std::strstr(dec_in[in], "_key_") != nullptr;
      feeds[in] = tensor({rows, m.n_heads, 0, key ? m.head_dim_k : m.head_dim_v}, float_type);
    }
    past_len = 0;
  }

  // Feeds one token a row and runs the decoder for `outputs` (to_host: those that come to the host); the presents
  // become the next step's past. `shift`: where the logits were left out, the presents' index one lower.
  std::vector<Ort::Value> feed(const Ids& tokens, const std::vector<const char*>& outputs,
                               const std::vector<const char*>& to_host, size_t shift) {
    if (past_len + 1 > m.max_positions)
      throw Error("decoder: " + std::to_string(past_len + 1) + " target positions, the model has " +
                  std::to_string(m.max_positions) + " (max_positions)");
    feeds[ids_slot] = tensor({rows, 1}, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64);
    std::copy(tokens.begin(), tokens.end(), feeds[ids_slot].GetTensorMutableData<int64_t>());
    feeds[lengths_slot] = tensor({rows}, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64);  // every row at one position here
    std::fill_n(feeds[lengths_slot].GetTensorMutableData<int64_t>(), rows, past_len);
    auto out = run(decoder, "decoder", dec_in, feeds.data(), outputs, to_host);
    for (const auto& [in, present] : self_slots)  // present -> next past
      feeds[in] = std::move(out[present - (present > logits_out ? shift : 0)]);
    ++past_len;
    return out;
  }

  int64_t search_width() const override { return m.search_width; }

  Search search_step(const Ids& tokens) override {
    search_values = feed(tokens, dec_out_search, {"top_logits", "top_ids", "log_norm"}, 1);
    const auto shape = search_values[top_ids_out].GetTensorTypeAndShapeInfo().GetShape();
    if (shape != std::vector<int64_t>{rows, m.search_width})
      throw Error("decoder graph: top_ids shape does not match [batch, " + std::to_string(m.search_width) +
                  "] of the manifest");
    const int64_t* ids = search_values[top_ids_out].GetTensorData<int64_t>();
    if (float_type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT)
      return {search_values[top_logits_out].GetTensorData<float>(), ids,
              search_values[log_norm_out].GetTensorData<float>()};
    auto widen = [](const Ort::Value& value, std::vector<float>& out) {
      const auto* half = value.GetTensorData<Ort::Float16_t>();
      out.resize(value.GetTensorTypeAndShapeInfo().GetElementCount());
      for (size_t i = 0; i < out.size(); ++i) out[i] = half[i].ToFloat();
      return out.data();
    };
    return {widen(search_values[top_logits_out], top_f32), ids, widen(search_values[log_norm_out], norm_f32)};
  }

  float* step(const Ids& tokens) override {
    auto out = feed(tokens, dec_out, {"logits"}, 0);
    logits = std::move(out[logits_out]);
    const auto info = logits.GetTensorTypeAndShapeInfo();
    if (info.GetShape() != std::vector<int64_t>{rows, 1, m.tgt_vocab_size})
      throw Error("decoder graph: logits shape does not match [batch, 1, tgt_vocab_size] of the manifest");
    if (float_type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT) return logits.GetTensorMutableData<float>();
    const auto* half = logits.GetTensorData<Ort::Float16_t>();
    logits_f32.resize(info.GetElementCount());
    for (size_t i = 0; i < logits_f32.size(); ++i) logits_f32[i] = half[i].ToFloat();
    return logits_f32.data();
  }

  void expand(const std::vector<int64_t>& keep) override {
    for (size_t i = 0; i < feeds.size(); ++i)
      if (i != ids_slot && i != lengths_slot) feeds[i] = gather(feeds[i], keep);
    rows = static_cast<int64_t>(keep.size());
  }

  void reorder(const std::vector<int64_t>& keep) override {
    std::vector<int64_t> identity(keep.size());
    std::iota(identity.begin(), identity.end(), 0);
    if (keep == identity) return;
    for (const auto& slot : self_slots) feeds[slot.first] = gather(feeds[slot.first], keep);
  }

  detail::Specials specials() const { return {m.decoder_start_id, m.eos_id, m.pad_id, m.never_generate}; }

  // The ids forced on the decoder after its start id: the target language's (the default when none is given).
  // Python: Translator.prefix.
  Ids forced_ids(const std::string& tgt_lang) const {
    if (!m.tokenizer && !tgt_lang.empty())
      throw Error("this model has no tokenizer, hence no languages: leave out the target language");
    const std::string code = m.languages.target_code(tgt_lang);
    return code.empty() ? Ids{} : m.languages.target.at(code).decoder;
  }

  const Tokenizer& text_tokenizer() const {
    if (m.tokenizer && m.tokenizer->kind == "tokenizers")
      throw Error("this model's tokenizer is a Hugging Face tokenizer.json, which the C++ library does not read: pass "
                  "token ids (translate_ids), or import the model from a directory that also holds its "
                  "sentencepiece.bpe.model");
    if (!tokenizer) throw Error("this model has no tokenizer: text translation needs one (token-id APIs work without)");
    return *tokenizer;
  }

  void check_ids(const std::vector<Ids>& sources) const {
    for (size_t i = 0; i < sources.size(); ++i) {
      const std::string sentence = "sentence " + std::to_string(i + 1);
      const Ids& ids = sources[i];
      if (ids.empty()) throw Error(sentence + " is empty");
      if (static_cast<int64_t>(ids.size()) > m.max_positions)
        throw Error(sentence + " has " + std::to_string(ids.size()) + " tokens, the model takes at most " +
                    std::to_string(m.max_positions) + " (max_positions); split it into shorter sentences");
      std::string bad;
      int count = 0;
      for (int64_t t : ids)
        if ((t < 0 || t >= m.src_vocab_size) && count++ < 5) bad += (bad.empty() ? "" : ", ") + std::to_string(t);
      if (count)
        throw Error(sentence + " has token ids outside the vocabulary [0, " + std::to_string(m.src_vocab_size) +
                    "): [" + bad + "]");
    }
  }
};

Model::Model(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Model::Model(Model&&) noexcept = default;
Model& Model::operator=(Model&&) noexcept = default;
Model::~Model() = default;

Model Model::load(const fs::path& dir, const Options& options) {
  init_ort();
  return ort_errors(dir.string(), [&] { return Model(Impl::load(dir, options)); });
}

std::unique_ptr<Model::Impl> Model::Impl::load(const fs::path& dir, const Options& options) {
  auto impl = std::make_unique<Impl>();
  Impl& x = *impl;
  x.m = Manifest::read(dir);
  const Manifest& m = x.m;
  if (m.dtype == "float16") x.float_type = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16;
  else if (m.dtype != "float32") throw Error((dir / "manifest.json").string() + ": unsupported dtype " + m.dtype);

  x.enc_in = c_strs(m.encoder.inputs), x.enc_out = c_strs(m.encoder.outputs);
  x.dec_in = c_strs(m.decoder.inputs), x.dec_out = c_strs(m.decoder.outputs);
  if (m.encoder.inputs.size() != 2) throw Error("encoder graph: expected inputs input_ids and attention_mask");
  x.enc_ids = index_of(m.encoder.inputs, "input_ids", "encoder");
  index_of(m.encoder.inputs, "attention_mask", "encoder");
  x.ids_slot = index_of(m.decoder.inputs, "input_ids", "decoder");
  x.mask_slot = index_of(m.decoder.inputs, "encoder_attention_mask", "decoder");
  x.lengths_slot = index_of(m.decoder.inputs, "past_lengths", "decoder");
  x.logits_out = index_of(m.decoder.outputs, "logits", "decoder");
  if (m.search_width > 0) {
    std::vector<std::string> outputs = m.decoder.outputs;
    outputs.erase(outputs.begin() + static_cast<std::ptrdiff_t>(x.logits_out));
    for (size_t i = 0; i < x.dec_out.size(); ++i)
      if (i != x.logits_out) x.dec_out_search.push_back(x.dec_out[i]);
    x.top_logits_out = index_of(outputs, "top_logits", "decoder");
    x.top_ids_out = index_of(outputs, "top_ids", "decoder");
    x.log_norm_out = index_of(outputs, "log_norm", "decoder");
  }
  for (size_t i = 0; i < m.decoder.inputs.size(); ++i) {
    const std::string& name = m.decoder.inputs[i];
    if (i == x.ids_slot || i == x.mask_slot || i == x.lengths_slot) continue;
    const std::string present = "present_" + name.substr(name.rfind("past_", 0) == 0 ? 5 : 0);
    if (name.rfind("past_", 0) == 0 && name.find("_self_") != std::string::npos)
      x.self_slots.emplace_back(i, index_of(m.decoder.outputs, present, "decoder"));
    else if (name.rfind("past_", 0) == 0 && name.find("_cross_") != std::string::npos)
      x.cross_slots.emplace_back(i, index_of(m.encoder.outputs, present, "encoder"));
    else
      throw Error("decoder graph: unexpected input " + name);
  }

  m.check_external_data();
  x.encoder = x.open(options, m.encoder.file);
  x.decoder = x.open(options, m.decoder.file);
  check_io(x.encoder, m.encoder, "encoder");
  check_io(x.decoder, m.decoder, "decoder");
  x.bound = options.provider == "cuda" || options.io_binding;
  if (x.bound) {
    x.state_memory = options.provider == "cuda" ? Ort::MemoryInfo("Cuda", OrtDeviceAllocator, 0, OrtMemTypeDefault)
                                                : Ort::MemoryInfo::CreateCpu(OrtDeviceAllocator, OrtMemTypeDefault);
    x.host_memory = Ort::MemoryInfo::CreateCpu(OrtDeviceAllocator, OrtMemTypeCPUOutput);
    x.gather_float = x.open_gather(options, x.float_type);
    x.gather_int64 = x.open_gather(options, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64);
  }
  if (m.tokenizer && m.tokenizer->kind == "sentencepiece") x.tokenizer = Tokenizer::load(m);
  return impl;
}

const Manifest& Model::manifest() const { return impl_->m; }

std::vector<Ids> Model::greedy(const std::vector<Ids>& sources, int max_new_tokens, bool suppress_eos,
                               const std::vector<Ids>& forced) {
  return ort_errors("greedy", [&] {
    return detail::greedy(*impl_, sources, impl_->specials(), max_new_tokens, suppress_eos, forced);
  });
}

std::vector<std::vector<Hypothesis>> Model::beam_search(const std::vector<Ids>& sources, int beam_size,
                                                        double length_penalty, int n_best, int max_new_tokens,
                                                        bool suppress_eos, const std::vector<Ids>& forced,
                                                        const std::string& beam_stop) {
  check_beam_stop(beam_stop);
  return ort_errors("beam search", [&] {
    return detail::beam_search(*impl_, sources, impl_->specials(), beam_size, length_penalty, n_best,
                               max_new_tokens, suppress_eos, forced, beam_stop == "transformers");
  });
}

std::vector<std::vector<Hypothesis>> Model::decode_ids(const std::vector<Ids>& sources, const DecodeOptions& o,
                                                       const StepCallback& on_step) {
  if (o.beam_size < 1) throw Error("beam size must be at least 1, got " + std::to_string(o.beam_size));
  if (o.batch_size < 1) throw Error("batch size must be at least 1, got " + std::to_string(o.batch_size));
  if (o.max_new_tokens < 0) throw Error("max_new_tokens must be 0 (automatic) or more");
  check_beam_stop(o.beam_stop);
  const Ids forced_ids = impl_->forced_ids(o.tgt_lang);
  impl_->check_ids(sources);
  std::vector<size_t> order(sources.size());  // similar lengths share a batch
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return sources[a].size() < sources[b].size(); });
  std::vector<std::vector<Hypothesis>> results(sources.size());
  bool stopped = false;  // on_step said stop: no more batches
  for (size_t start = 0; start < order.size() && !stopped; start += o.batch_size) {
    const size_t end = std::min(order.size(), start + o.batch_size);
    std::vector<Ids> batch;
    size_t longest = 0;
    for (size_t i = start; i < end; ++i) batch.push_back(sources[order[i]]), longest = std::max(longest, batch.back().size());
    const int max_new = o.max_new_tokens ? o.max_new_tokens
                                         : static_cast<int>(std::min<int64_t>(impl_->m.max_positions, 2 * longest + 16));
    const std::vector<Ids> forced(forced_ids.empty() ? 0 : batch.size(), forced_ids);
    detail::Progress progress;  // a batch row's news, as the caller's sentence
    if (on_step)
      progress = [&](size_t row, Ids tokens, bool finished) {
        StepEvent event;
        event.sentence = order[start + row], event.tokens = std::move(tokens), event.finished = finished;
        stopped = !on_step(event);
        return !stopped;
      };
    std::vector<std::vector<Hypothesis>> outs;
    if (o.beam_size > 1) {
      outs = ort_errors("beam search", [&] {
        return detail::beam_search(*impl_, batch, impl_->specials(), o.beam_size, o.length_penalty, o.n_best, max_new,
                                   o.suppress_eos, forced, o.beam_stop == "transformers", progress);
      });
    } else {
      auto tokens = ort_errors("greedy", [&] {
        return detail::greedy(*impl_, batch, impl_->specials(), max_new, o.suppress_eos, forced, progress);
      });
      for (auto& t : tokens) outs.push_back({{std::move(t), 0.0}});
    }
    for (size_t i = start; i < end; ++i) results[order[i]] = std::move(outs[i - start]);
  }
  return results;
}

std::vector<Ids> Model::translate_ids(const std::vector<Ids>& sources, const DecodeOptions& options,
                                      const StepCallback& on_step) {
  std::vector<Ids> out;
  for (auto& hyps : decode_ids(sources, options, on_step))
    out.push_back(hyps.empty() ? Ids{} : std::move(hyps[0].tokens));
  return out;
}

Ids Model::encode(const std::string& text, const std::string& src_lang, const std::string& tgt_lang) const {
  return impl_->text_tokenizer().encode(text, src_lang, tgt_lang);
}
std::vector<Ids> Model::encode(const std::vector<std::string>& texts, const std::string& src_lang,
                               const std::string& tgt_lang) const {
  return impl_->text_tokenizer().encode(texts, src_lang, tgt_lang);
}
std::string Model::decode(const Ids& ids) const { return impl_->text_tokenizer().decode(ids); }

std::vector<std::string> Model::translate(const std::vector<std::string>& texts, const DecodeOptions& options,
                                          const StepCallback& on_step) {
  const std::vector<Ids> sources = encode(texts, options.src_lang, options.tgt_lang);
  std::vector<detail::TextDeltas> deltas;  // each sentence's text shown so far
  StepCallback with_deltas;
  if (on_step) {
    deltas.assign(texts.size(), detail::TextDeltas([this](const Ids& ids) { return decode(ids); }));
    with_deltas = [&](const StepEvent& event) {
      StepEvent news = event;
      detail::TextDeltas& text = deltas[event.sentence];
      news.delta = event.finished ? text.finish(event.tokens) : text.next(event.tokens);
      return on_step(news);
    };
  }
  std::vector<std::string> out;
  for (const auto& ids : translate_ids(sources, options, with_deltas)) out.push_back(decode(ids));
  return out;
}

}  // namespace twostep
