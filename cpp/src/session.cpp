// The plain decoder's step session, and the ONNX Runtime helpers every session shares (session.h).
#include "session.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <numeric>
#include <set>

#include "providers.h"

namespace twostep {
namespace fs = std::filesystem;

std::vector<std::pair<std::string, std::string>> detail::cuda_provider_options() {
  return {{"device_id", "0"}, {"use_tf32", "0"}};
}

void detail::init_ort() {
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

size_t detail::element_size(ONNXTensorElementDataType type) {
  switch (type) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: return 4;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: return 2;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64: return 8;
    default: throw Error("unexpected tensor element type " + std::to_string(type));
  }
}

namespace {
using detail::element_size;
using detail::ort_errors;

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

Ort::Session open_graph(Ort::Env& env, const fs::path& path, const Options& options) {
  try {
    return Ort::Session(env, path.c_str(), session_options(options));
  } catch (const Ort::Exception& e) {
    throw Error(path.string() + ": ONNX Runtime cannot load it: " + e.what());
  }
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


namespace detail {

PlainSession::PlainSession(Ort::Env& env, const Manifest& manifest, const Manifest::Graph& g, const Options& options)
    : m(manifest), graph(g.name) {
  if (m.dtype == "float16") float_type = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16;
  else if (m.dtype != "float32") throw Error((m.dir / "manifest.json").string() + ": unsupported dtype " + m.dtype);

  enc_in = c_strs(m.encoder.inputs), enc_out = c_strs(m.encoder.outputs);
  dec_in = c_strs(g.inputs);
  std::vector<std::string> step_outputs;  // what a step fetches: every output but the alignment
  for (const std::string& name : g.outputs)
    if (name != "alignment") step_outputs.push_back(name), dec_out.push_back(name.c_str());
  if (m.encoder.inputs.size() != 2) throw Error("encoder graph: expected inputs input_ids and attention_mask");
  enc_ids = index_of(m.encoder.inputs, "input_ids", "encoder");
  index_of(m.encoder.inputs, "attention_mask", "encoder");
  ids_slot = index_of(g.inputs, "input_ids", graph);
  mask_slot = index_of(g.inputs, "encoder_attention_mask", graph);
  lengths_slot = index_of(g.inputs, "past_lengths", graph);
  logits_out = index_of(step_outputs, "logits", graph);
  searches = m.search_width > 0 && std::count(step_outputs.begin(), step_outputs.end(), "top_ids");
  if (searches) {
    std::vector<std::string> outputs = step_outputs;
    outputs.erase(outputs.begin() + static_cast<std::ptrdiff_t>(logits_out));
    for (size_t i = 0; i < dec_out.size(); ++i)
      if (i != logits_out) dec_out_search.push_back(dec_out[i]);
    top_logits_out = index_of(outputs, "top_logits", graph);
    top_ids_out = index_of(outputs, "top_ids", graph);
    log_norm_out = index_of(outputs, "log_norm", graph);
  }
  for (size_t i = 0; i < g.inputs.size(); ++i) {
    const std::string& name = g.inputs[i];
    if (i == ids_slot || i == mask_slot || i == lengths_slot) continue;
    const std::string present = "present_" + name.substr(name.rfind("past_", 0) == 0 ? 5 : 0);
    if (name.rfind("past_", 0) == 0 && name.find("_self_") != std::string::npos)
      self_slots.emplace_back(i, index_of(step_outputs, present, graph));
    else if (name.rfind("past_", 0) == 0 && name.find("_cross_") != std::string::npos)
      cross_slots.emplace_back(i, index_of(m.encoder.outputs, present, "encoder"));
    else
      throw Error(graph + " graph: unexpected input " + name);
  }

  encoder = open_graph(env, m.dir / m.encoder.file, options);
  decoder = open_graph(env, m.dir / g.file, options);
  check_io(encoder, m.encoder, "encoder");
  check_io(decoder, g, graph);
  bound = options.provider == "cuda" || options.io_binding;
  if (bound) {
    state_memory = options.provider == "cuda" ? Ort::MemoryInfo("Cuda", OrtDeviceAllocator, 0, OrtMemTypeDefault)
                                              : Ort::MemoryInfo::CreateCpu(OrtDeviceAllocator, OrtMemTypeDefault);
    host_memory = Ort::MemoryInfo::CreateCpu(OrtDeviceAllocator, OrtMemTypeCPUOutput);
    gather_float = open_gather(env, options, float_type);
    gather_int64 = open_gather(env, options, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64);
  }
}

Ort::Session PlainSession::open_gather(Ort::Env& env, const Options& options, ONNXTensorElementDataType type) {
  const std::string model = gather_model(type);
  return ort_errors("the beam reorder Gather", [&] {
    return Ort::Session(env, model.data(), model.size(), session_options(options));
  });
}

// One graph run; bound, every output stays in state_memory except those `to_host` (the logits, or the search
// outputs).
std::vector<Ort::Value> PlainSession::run(Ort::Session& session, const char* name, const std::vector<const char*>& in,
                                          const Ort::Value* values, const std::vector<const char*>& out,
                                          const std::vector<const char*>& to_host) {
  return ort_errors(std::string(name) + " graph", [&] {
    if (!bound) return session.Run(Ort::RunOptions{nullptr}, in.data(), values, in.size(), out.data(), out.size());
    Ort::IoBinding binding(session);
    for (size_t i = 0; i < in.size(); ++i) binding.BindInput(in[i], values[i]);
    for (const char* output : out) {
      const bool host = std::any_of(to_host.begin(), to_host.end(),
                                    [&](const char* h) { return std::strcmp(output, h) == 0; });
      binding.BindOutput(output, host ? host_memory : state_memory);
    }
    session.Run(Ort::RunOptions{nullptr}, binding);
    binding.SynchronizeOutputs();
    return binding.GetOutputValues();
  });
}

Ort::Value PlainSession::tensor(const std::vector<int64_t>& shape, ONNXTensorElementDataType type) {
  return Ort::Value::CreateTensor(alloc, shape.data(), shape.size(), type);
}

Ort::Value PlainSession::gather(const Ort::Value& value, const std::vector<int64_t>& keep) {
  const auto info = value.GetTensorTypeAndShapeInfo();
  if (bound) {
    Ort::Value indices = tensor({static_cast<int64_t>(keep.size())}, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64);
    std::copy(keep.begin(), keep.end(), indices.GetTensorMutableData<int64_t>());
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
  shape[0] = static_cast<int64_t>(keep.size());
  Ort::Value out = tensor(shape, info.GetElementType());
  if (row_bytes == 0) return out;
  const auto* src = static_cast<const char*>(value.GetTensorRawData());
  auto* dst = static_cast<char*>(out.GetTensorMutableRawData());
  for (size_t i = 0; i < keep.size(); ++i) std::memcpy(dst + i * row_bytes, src + keep[i] * row_bytes, row_bytes);
  return out;
}

float* PlainSession::floats(Ort::Value& value, std::vector<float>& widened) {
  if (float_type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT) return value.GetTensorMutableData<float>();
  const auto* half = value.GetTensorData<Ort::Float16_t>();
  widened.resize(value.GetTensorTypeAndShapeInfo().GetElementCount());
  for (size_t i = 0; i < widened.size(); ++i) widened[i] = half[i].ToFloat();
  return widened.data();
}

void PlainSession::check_positions(int64_t positions) const {
  if (positions > m.max_positions)
    throw Error(graph + ": " + std::to_string(positions) + " target positions, the model has " +
                std::to_string(m.max_positions) + " (max_positions)");
}

void PlainSession::start(const std::vector<Ids>& sources) {
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
std::vector<Ort::Value> PlainSession::feed(const Ids& tokens, const std::vector<const char*>& outputs,
                                           const std::vector<const char*>& to_host, size_t shift) {
  check_positions(past_len + 1);
  feeds[ids_slot] = tensor({rows, 1}, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64);
  std::copy(tokens.begin(), tokens.end(), feeds[ids_slot].GetTensorMutableData<int64_t>());
  feeds[lengths_slot] = tensor({rows}, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64);  // every row at one position here
  std::fill_n(feeds[lengths_slot].GetTensorMutableData<int64_t>(), rows, past_len);
  auto out = run(decoder, graph.c_str(), dec_in, feeds.data(), outputs, to_host);
  for (const auto& [in, present] : self_slots)  // present -> next past
    feeds[in] = std::move(out[present - (present > logits_out ? shift : 0)]);
  ++past_len;
  return out;
}

StepSession::Search PlainSession::search_step(const Ids& tokens) {
  search_values = feed(tokens, dec_out_search, {"top_logits", "top_ids", "log_norm"}, 1);
  const auto shape = search_values[top_ids_out].GetTensorTypeAndShapeInfo().GetShape();
  if (shape != std::vector<int64_t>{rows, m.search_width})
    throw Error(graph + " graph: top_ids shape does not match [batch, " + std::to_string(m.search_width) +
                "] of the manifest");
  return {floats(search_values[top_logits_out], top_f32), search_values[top_ids_out].GetTensorData<int64_t>(),
          floats(search_values[log_norm_out], norm_f32)};
}

float* PlainSession::step(const Ids& tokens) {
  auto out = feed(tokens, dec_out, {"logits"}, 0);
  logits = std::move(out[logits_out]);
  if (logits.GetTensorTypeAndShapeInfo().GetShape() != std::vector<int64_t>{rows, 1, m.tgt_vocab_size})
    throw Error(graph + " graph: logits shape does not match [batch, 1, tgt_vocab_size] of the manifest");
  return floats(logits, logits_f32);
}

std::vector<float> PlainSession::alignment(const Ids& source, const Ids& targets) {
  if (!m.alignment)
    throw Error("this model's decoder gives no alignment (replace_unknowns needs a model imported with alignment "
                "heads: a CTranslate2 model or Argos package)");
  const auto width = static_cast<int64_t>(source.size()), length = static_cast<int64_t>(targets.size());
  check_positions(length);
  Ort::Value enc_feeds[2] = {tensor({1, width}, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64),
                             tensor({1, width}, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64)};
  std::copy(source.begin(), source.end(), enc_feeds[enc_ids].GetTensorMutableData<int64_t>());
  std::fill_n(enc_feeds[1 - enc_ids].GetTensorMutableData<int64_t>(), width, 1);
  auto enc = ort_errors("encoder graph", [&] {
    return encoder.Run(Ort::RunOptions{nullptr}, enc_in.data(), enc_feeds, enc_in.size(), enc_out.data(),
                       enc_out.size());
  });
  std::vector<Ort::Value> in;
  for (size_t i = 0; i < dec_in.size(); ++i) in.emplace_back(nullptr);
  in[ids_slot] = tensor({1, length}, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64);
  std::copy(targets.begin(), targets.end(), in[ids_slot].GetTensorMutableData<int64_t>());
  in[lengths_slot] = tensor({1}, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64);
  *in[lengths_slot].GetTensorMutableData<int64_t>() = 0;
  in[mask_slot] = std::move(enc_feeds[1 - enc_ids]);
  for (const auto& [slot, out] : cross_slots) in[slot] = std::move(enc[out]);
  for (const auto& [slot, out] : self_slots) {  // empty: zeros of the capacity the graph takes
    const bool key = std::strstr(dec_in[slot], "_key_") != nullptr;
    in[slot] = tensor({1, m.n_heads, empty_capacity(length), key ? m.head_dim_k : m.head_dim_v}, float_type);
    const size_t bytes = in[slot].GetTensorTypeAndShapeInfo().GetElementCount() * element_size(float_type);
    if (bytes) std::memset(in[slot].GetTensorMutableRawData(), 0, bytes);
  }
  const char* name = "alignment";
  auto out = ort_errors(graph + " graph", [&] {
    return decoder.Run(Ort::RunOptions{nullptr}, dec_in.data(), in.data(), in.size(), &name, 1);
  });
  if (out[0].GetTensorTypeAndShapeInfo().GetShape() != std::vector<int64_t>{1, length, width})
    throw Error(graph + " graph: alignment shape does not match [batch, new_len, src_len] of the manifest");
  std::vector<float> widened;
  const float* data = floats(out[0], widened);
  return std::vector<float>(data, data + length * width);
}

void PlainSession::expand(const std::vector<int64_t>& keep) {
  for (size_t i = 0; i < feeds.size(); ++i)
    if (i != ids_slot && i != lengths_slot) feeds[i] = gather(feeds[i], keep);
  rows = static_cast<int64_t>(keep.size());
}

void PlainSession::reorder(const std::vector<int64_t>& keep) {
  std::vector<int64_t> identity(keep.size());
  std::iota(identity.begin(), identity.end(), 0);
  if (keep == identity) return;
  for (const auto& slot : self_slots) feeds[slot.first] = gather(feeds[slot.first], keep);
}

}  // namespace detail
}  // namespace twostep
