// The step session over the in-place decoder (Manifest::inplace; twostep/exporter/inplace.py), as the Python
// ort-cpu backend runs it (twostep/runtime/backends/inplace.py, InplaceSession). Internal header.
#pragma once

#include <vector>

#include "session.h"

namespace twostep::detail {

// The encoder, and the mask and cross K/V between steps, are as for the plain decoder (PlainSession); the
// self-attention cache is this session's own: one host buffer per layer and kind, [rows, heads, capacity,
// head_dim], bound with IO binding as both the past input and the present output, so ONNX Runtime writes each
// step's K/V into it: nothing is concatenated or handed back. Row r's history is its first past_lengths[r]
// positions (the decoding loop keeps every row at past_len). The capacity doubles (kFirstCapacity, then up to
// max_positions) when a decode outgrows it, the filled part copied over. Beam search's reorder moves, in place,
// only the rows whose beam of origin is another row, and only their filled positions. Logits and the search
// outputs land in buffers reused across steps, and one binding serves every step until a buffer changes: a step
// writes its token ids and lengths into the bound tensors and runs.
class InplaceSession final : public PlainSession {
 public:
  static constexpr int64_t kFirstCapacity = 32;

  // `decoder`: the manifest's in-place decoder. The session runs on the host (provider cpu, no io_binding).
  InplaceSession(Ort::Env& env, const Manifest& m, const Manifest::Graph& decoder, const Options& options);

  void start(const std::vector<Ids>& sources) override;
  float* step(const Ids& tokens) override;
  Search search_step(const Ids& tokens) override;
  void expand(const std::vector<int64_t>& rows) override;
  void reorder(const std::vector<int64_t>& rows) override;

  // For tests: the cache's capacity, and whether each present output of the last step is its cache buffer itself
  // (ONNX Runtime wrote into the buffer, and handed back no other tensor).
  int64_t capacity() const { return capacity_; }
  bool wrote_in_place() const;

 private:
  // The step's token ids and lengths, and the logits' and search outputs' buffers, for `rows` rows; the binding
  // is made anew.
  void make_outputs();
  // Capacity for `positions`: doubled (up to max_positions), the filled part copied over.
  void reserve(int64_t positions);
  // The cache's rows `keep` (filled part) in new buffers of keep.size() rows.
  void take_rows(const std::vector<int64_t>& keep);
  Ort::Value zeros(const std::vector<int64_t>& shape);
  void run(const Ids& tokens);
  int64_t empty_capacity(int64_t new_len) const override { return new_len; }

  int64_t capacity_ = 0;
  Ort::Value top_logits{nullptr}, top_ids{nullptr}, log_norm{nullptr};
  Ort::IoBinding binding{nullptr};  // bound to every input and output; null once a bound tensor is replaced
  std::vector<char> moved;  // reorder: the origin rows' filled positions, copied before any is overwritten
};

}  // namespace twostep::detail
