// The in-place decoder's step session (inplace.h), a port of twostep/runtime/backends/inplace.py.
#include "inplace.h"

#include <algorithm>
#include <cstring>

namespace twostep::detail {
namespace {
// A cache buffer [rows, heads, capacity, head_dim]: where row r's head h begins, in bytes, and one position's size.
struct Layout {
  int64_t heads, capacity, position_bytes;

  explicit Layout(const Ort::Value& buffer) {
    const auto info = buffer.GetTensorTypeAndShapeInfo();
    const auto shape = info.GetShape();
    heads = shape[1], capacity = shape[2];
    position_bytes = shape[3] * static_cast<int64_t>(element_size(info.GetElementType()));
  }
  size_t at(int64_t row, int64_t head) const {
    return static_cast<size_t>((row * heads + head) * capacity * position_bytes);
  }
};

// Positions [0, n) of row `from` of `src` into row `to` of `dst`, buffers of one layer and kind (capacities may
// differ).
void copy_positions(const Ort::Value& src, int64_t from, Ort::Value& dst, int64_t to, int64_t n) {
  if (n == 0) return;
  const Layout s(src), d(dst);
  const auto* in = static_cast<const char*>(src.GetTensorRawData());
  auto* out = static_cast<char*>(dst.GetTensorMutableRawData());
  for (int64_t h = 0; h < s.heads; ++h) std::memcpy(out + d.at(to, h), in + s.at(from, h), n * s.position_bytes);
}
}  // namespace

InplaceSession::InplaceSession(Ort::Env& env, const Manifest& m, const Manifest::Graph& decoder,
                               const Options& options)
    : PlainSession(env, m, decoder, options) {
  if (bound) throw Error(graph + ": the in-place decoder runs on the CPU provider, without io_binding");
}

void InplaceSession::start(const std::vector<Ids>& sources) {
  PlainSession::start(sources);  // the encoder: mask and cross K/V in feeds, zero-length caches
  capacity_ = 0;
  make_outputs();
  reserve(kFirstCapacity);
}

void InplaceSession::make_outputs() {
  feeds[ids_slot] = tensor({rows, 1}, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64);
  feeds[lengths_slot] = tensor({rows}, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64);
  logits = tensor({rows, 1, m.tgt_vocab_size}, float_type);
  if (searches) {
    top_logits = tensor({rows, m.search_width}, float_type);
    top_ids = tensor({rows, m.search_width}, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64);
    log_norm = tensor({rows}, float_type);
  }
  binding = Ort::IoBinding(nullptr);
}

void InplaceSession::reserve(int64_t positions) {
  if (positions <= capacity_) return;
  const int64_t capacity = std::min(std::max({positions, 2 * capacity_, kFirstCapacity}), m.max_positions);
  for (const auto& slot : self_slots) {
    Ort::Value& buffer = feeds[slot.first];
    std::vector<int64_t> shape = buffer.GetTensorTypeAndShapeInfo().GetShape();
    shape[2] = capacity;
    Ort::Value grown = zeros(shape);
    for (int64_t r = 0; r < rows; ++r) copy_positions(buffer, r, grown, r, past_len);
    buffer = std::move(grown);
  }
  capacity_ = capacity;
  binding = Ort::IoBinding(nullptr);
}

void InplaceSession::take_rows(const std::vector<int64_t>& keep) {
  for (const auto& slot : self_slots) {
    Ort::Value& buffer = feeds[slot.first];
    std::vector<int64_t> shape = buffer.GetTensorTypeAndShapeInfo().GetShape();
    shape[0] = static_cast<int64_t>(keep.size());
    Ort::Value taken = zeros(shape);
    for (size_t r = 0; r < keep.size(); ++r) copy_positions(buffer, keep[r], taken, static_cast<int64_t>(r), past_len);
    buffer = std::move(taken);
  }
}

Ort::Value InplaceSession::zeros(const std::vector<int64_t>& shape) {
  Ort::Value out = tensor(shape, float_type);
  const size_t bytes = out.GetTensorTypeAndShapeInfo().GetElementCount() * element_size(float_type);
  if (bytes) std::memset(out.GetTensorMutableRawData(), 0, bytes);
  return out;
}

void InplaceSession::run(const Ids& tokens) {
  check_positions(past_len + 1);
  reserve(past_len + 1);
  if (!binding) {
    binding = Ort::IoBinding(decoder);
    for (size_t i = 0; i < dec_in.size(); ++i) binding.BindInput(dec_in[i], feeds[i]);
    for (const auto& [in, present] : self_slots) binding.BindOutput(dec_out[present], feeds[in]);  // the same tensor
    binding.BindOutput("logits", logits);
    if (searches) {
      binding.BindOutput("top_logits", top_logits);
      binding.BindOutput("top_ids", top_ids);
      binding.BindOutput("log_norm", log_norm);
    }
  }
  std::copy(tokens.begin(), tokens.end(), feeds[ids_slot].GetTensorMutableData<int64_t>());
  std::fill_n(feeds[lengths_slot].GetTensorMutableData<int64_t>(), rows, past_len);  // every row at one position
  ort_errors(graph + " graph", [&] { decoder.Run(Ort::RunOptions{nullptr}, binding); });
  ++past_len;
}

float* InplaceSession::step(const Ids& tokens) {
  run(tokens);
  return floats(logits, logits_f32);
}

StepSession::Search InplaceSession::search_step(const Ids& tokens) {
  run(tokens);
  return {floats(top_logits, top_f32), top_ids.GetTensorData<int64_t>(), floats(log_norm, norm_f32)};
}

void InplaceSession::expand(const std::vector<int64_t>& keep) {
  feeds[mask_slot] = gather(feeds[mask_slot], keep);
  for (const auto& slot : cross_slots) feeds[slot.first] = gather(feeds[slot.first], keep);
  take_rows(keep);
  rows = static_cast<int64_t>(keep.size());
  make_outputs();
}

void InplaceSession::reorder(const std::vector<int64_t>& keep) {
  if (static_cast<int64_t>(keep.size()) != rows) return expand(keep);
  std::vector<int64_t> to;  // the rows that take another row's cache
  for (int64_t r = 0; r < rows; ++r)
    if (keep[r] != r) to.push_back(r);
  if (to.empty() || past_len == 0) return;
  for (const auto& slot : self_slots) {
    Ort::Value& buffer = feeds[slot.first];
    const Layout l(buffer);
    const size_t span = static_cast<size_t>(past_len * l.position_bytes);  // one head's filled positions
    auto* data = static_cast<char*>(buffer.GetTensorMutableRawData());
    moved.resize(to.size() * l.heads * span);
    char* copy = moved.data();
    for (int64_t r : to)  // every origin copied out first: a row may be moved and another's origin
      for (int64_t h = 0; h < l.heads; ++h, copy += span) std::memcpy(copy, data + l.at(keep[r], h), span);
    copy = moved.data();
    for (int64_t r : to)
      for (int64_t h = 0; h < l.heads; ++h, copy += span) std::memcpy(data + l.at(r, h), copy, span);
  }
}

bool InplaceSession::wrote_in_place() const {
  if (!binding || self_slots.empty()) return false;
  const std::vector<std::string> names = binding.GetOutputNames();
  const std::vector<Ort::Value> values = binding.GetOutputValues();
  for (const auto& [in, present] : self_slots) {
    const auto at = std::find(names.begin(), names.end(), dec_out[present]);
    if (at == names.end() || values[at - names.begin()].GetTensorRawData() != feeds[in].GetTensorRawData())
      return false;
  }
  return true;
}

}  // namespace twostep::detail
