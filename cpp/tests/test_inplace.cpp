// The in-place decoder's step session (inplace.h) against the plain decoder's, step by step, and the Model's choice
// between them, on the artifacts tests/cpp/test_cpp.py passes: TWOSTEP_TEST_INPLACE_ARTIFACT (the demo model
// exported with its in-place decoder) and TWOSTEP_TEST_ARTIFACT (without it). Skipped without them.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "inplace.h"

namespace {
using twostep::Ids;
using twostep::detail::InplaceSession;
using twostep::detail::PlainSession;
using twostep::detail::StepSession;

const char* const kInplaceArtifact = std::getenv("TWOSTEP_TEST_INPLACE_ARTIFACT");
const char* const kPlainArtifact = std::getenv("TWOSTEP_TEST_ARTIFACT");

Ort::Env make_env() {
  twostep::detail::init_ort();
  return Ort::Env(ORT_LOGGING_LEVEL_WARNING, "twostep-tests");
}

// Both sessions' search outputs of one step: the same best ids, logits and normalisers to float32 noise (the two
// graphs attend in a different order).
void check_same(const StepSession::Search& plain, const StepSession::Search& inplace, int64_t rows, int64_t width) {
  for (int64_t r = 0; r < rows; ++r) {
    CAPTURE(r);
    for (int64_t j = 0; j < 4; ++j) CHECK(inplace.top_ids[r * width + j] == plain.top_ids[r * width + j]);
    for (int64_t j = 0; j < width; ++j)
      CHECK(std::abs(inplace.top_logits[r * width + j] - plain.top_logits[r * width + j]) < 1e-4);
    CHECK(std::abs(inplace.log_norm[r] - plain.log_norm[r]) < 1e-4);
  }
}
}  // namespace

TEST_CASE("in-place decoder: the plain decoder's steps, through reorders and the cache's growth, written in place" *
          doctest::skip(!kInplaceArtifact)) {
  Ort::Env env = make_env();
  const twostep::Manifest m = twostep::Manifest::read(kInplaceArtifact);
  REQUIRE(m.inplace);
  REQUIRE(m.search_width > 0);
  const twostep::Options options{1, "cpu"};
  PlainSession plain(env, m, m.decoder, options);
  InplaceSession inplace(env, m, *m.inplace, options);
  // Three sources of different lengths, two rows each (beam search's expand).
  const std::vector<Ids> sources = {{5, 9, 13, 3}, {7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 3}, {20, 3}};
  const std::vector<int64_t> rows = {0, 0, 1, 1, 2, 2};
  plain.start(sources), inplace.start(sources);
  plain.expand(rows), inplace.expand(rows);
  // Each step's reorder, within each sentence's two rows: swap them (each row the other's origin), both the first,
  // both the second, none.
  const std::vector<std::vector<int64_t>> reorders = {{1, 0, 3, 2, 5, 4}, {0, 0, 2, 2, 4, 4}, {1, 1, 3, 3, 5, 5},
                                                      {0, 1, 2, 3, 4, 5}};
  const int64_t width = m.search_width, n = static_cast<int64_t>(rows.size());
  Ids tokens(n, m.decoder_start_id);
  for (int step = 0; step < 45; ++step) {  // past the first capacity, 32
    CAPTURE(step);
    const StepSession::Search a = plain.search_step(tokens), b = inplace.search_step(tokens);
    CHECK(inplace.wrote_in_place());
    CHECK(inplace.capacity() == (step < InplaceSession::kFirstCapacity ? 32 : 64));
    check_same(a, b, n, width);
    for (int64_t r = 0; r < n; ++r) tokens[r] = b.top_ids[r * width + r % 3];  // rows apart: the 1st, 2nd, 3rd best
    const std::vector<int64_t>& keep = reorders[step % reorders.size()];
    plain.reorder(keep), inplace.reorder(keep);
  }
}

TEST_CASE("in-place decoder: the Model decodes with it on the CPU; kv_cache concat and io_binding pick the plain one" *
          doctest::skip(!kInplaceArtifact || !kPlainArtifact)) {
  twostep::Options options{1, "cpu"};
  CHECK(twostep::Model::load(kInplaceArtifact, options).decoder() == "decoder_inplace");
  options.kv_cache = "inplace";
  CHECK(twostep::Model::load(kInplaceArtifact, options).decoder() == "decoder_inplace");
  options.kv_cache = "concat";
  CHECK(twostep::Model::load(kInplaceArtifact, options).decoder() == "decoder");
  options.kv_cache = "auto", options.io_binding = true;  // the path provider cuda takes: the plain decoder
  CHECK(twostep::Model::load(kInplaceArtifact, options).decoder() == "decoder");
  CHECK(twostep::Model::load(kPlainArtifact, {1, "cpu"}).decoder() == "decoder");

  options.kv_cache = "inplace";
  CHECK_THROWS_WITH_AS(twostep::Model::load(kInplaceArtifact, options),
                       "kv_cache inplace: the in-place decoder runs on provider cpu without io_binding", twostep::Error);
  options.io_binding = false;
  const std::string no_inplace = std::string(kPlainArtifact) + " has no in-place decoder: export it with `twostep "
                                 "export --inplace-cache`, or use kv_cache auto or concat";
  CHECK_THROWS_WITH_AS(twostep::Model::load(kPlainArtifact, options), no_inplace.c_str(), twostep::Error);
  options.kv_cache = "Concat";
  CHECK_THROWS_WITH_AS(twostep::Model::load(kInplaceArtifact, options),
                       "kv_cache must be one of auto, inplace, concat, got 'Concat'", twostep::Error);
}
