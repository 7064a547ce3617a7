// The unit tests' scripted StepSession: every row gets the same logits, those of the step (the last row of the
// script once past it); it records what it was fed. `kScript` makes greedy search say 4, then 5, then eos.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "decoding.h"
#include "twostep/twostep.h"

namespace {
constexpr int64_t kStart = 2, kEos = 3, kPad = 0, kForced = 7;
const twostep::detail::Specials kSpecials{kStart, kEos, kPad, {}};

const std::vector<std::vector<float>> kScript = {
    {0, 0, 0, 1, 5, 2, 0, 0}, {0, 0, 0, 1, 2, 5, 0, 0}, {0, 0, 0, 6, 1, 1, 0, 0}};

struct ScriptedSession : twostep::detail::StepSession {
  std::vector<std::vector<float>> script;
  std::vector<twostep::Ids> fed;
  std::vector<float> logits;
  int64_t rows = 0;

  explicit ScriptedSession(std::vector<std::vector<float>> s = kScript) : script(std::move(s)) {}
  void start(const std::vector<twostep::Ids>& sources) override { rows = sources.size(), fed.clear(); }
  float* step(const twostep::Ids& tokens) override {
    fed.push_back(tokens);
    const auto& row = script[std::min(fed.size(), script.size()) - 1];
    logits.clear();
    for (int64_t r = 0; r < rows; ++r) logits.insert(logits.end(), row.begin(), row.end());
    return logits.data();
  }
  void expand(const std::vector<int64_t>& keep) override { rows = keep.size(); }
  void reorder(const std::vector<int64_t>&) override {}
  int64_t vocab() const override { return script[0].size(); }
};
}  // namespace
