// The decoding loop, a line-by-line port of twostep/runtime/decoding/search.py (Greedy, Beam), written
// against a StepSession like the Python one. Internal header.
#pragma once

#include <functional>

#include "twostep/twostep.h"

namespace twostep::detail {

struct StepSession {
  virtual ~StepSession() = default;
  // Encode a batch of sources (right-padded inside) and reset the self-attention cache to zero length.
  virtual void start(const std::vector<Ids>& sources) = 0;
  // Feed one new token per row; returns float32 logits of that position, (rows, vocab) row-major, valid (and
  // the caller's to change) until the next call.
  virtual float* step(const Ids& tokens) = 0;
  // Keep rows `rows` of everything the decoder is fed (beam search's first step: B -> B*K rows).
  virtual void expand(const std::vector<int64_t>& rows) = 0;
  // Keep rows `rows` of the self-attention cache. Rows stay within each sentence's beams, whose cross K/V and
  // mask rows are equal, so those need no gather.
  virtual void reorder(const std::vector<int64_t>& rows) = 0;
  virtual int64_t vocab() const = 0;

  // The decoder's search outputs (twostep/artifact/spec.py) of the position fed: each row's `width` largest
  // logits (largest first, equal ones lower id first), their ids, and log(sum(exp(logits - the largest))),
  // row-major, valid until the next call. A session whose decoder has them (search_width() > 0) takes
  // search_step instead of step where a search needs no more: the full logits stay in the graph.
  struct Search {
    const float* top_logits;
    const int64_t* top_ids;
    const float* log_norm;
  };
  virtual int64_t search_width() const { return 0; }
  virtual Search search_step(const Ids& tokens) { (void)tokens; return {nullptr, nullptr, nullptr}; }
};

struct Specials {
  int64_t start_id, eos_id, pad_id;  // start_id: every row's first decoder input
  Ids never_generate;                // ids never chosen (they still count in beam search's softmax)
};

// A streamed decode's hook (Model's StepCallback): row `row` of the batch, its tokens so far without the forced
// ones, and whether they are final. greedy() calls it after every step for each row whose tokens grew or that
// finished, beam_search() once a row, when it finishes (with its best hypothesis). Returning false stops the
// decode after that step, as max_new_tokens would have, with no further calls. Empty: no streaming work at all.
using Progress = std::function<bool(size_t row, Ids tokens, bool finished)>;

// Beam search's stopping rule (DecodeOptions::beam_stop; twostep/runtime/decoding/search.py's Beam):
// transformers' with each of its early_stopping values (false, true, "never").
enum class BeamStop { n_best, transformers, transformers_early, transformers_never, ctranslate2 };
// "n_best", "transformers", "transformers_early", "transformers_never" or "ctranslate2"; an Error naming them
// for anything else.
BeamStop beam_stop(const std::string& rule);

// forced[i]: the ids forced on sentence i's decoder after its start id, one a step (its logits become -inf
// but for the forced id, 0). They count as generated tokens (max_new_tokens, length normalisation) but are
// left out of what is returned. Empty, or fewer rows than sources: nothing forced on the rest.
// stop: beam search's stopping rule. min_new_tokens: eos is out of a row's logits (before any softmax) at the
// steps before it, forced ones counted (Python's Group.block_early_eos). no_repeat_ngram_size: a token that would
// complete an n-gram of that size the row's tokens (its start id first) already hold is never chosen, as
// transformers' NoRepeatNGramLogitsProcessor has it (after beam search's softmax; not at a forced step; Python's
// Group.repeats); 0: no such rule.
std::vector<Ids> greedy(StepSession& session, const std::vector<Ids>& sources, const Specials& s,
                        int max_new_tokens, bool suppress_eos, const std::vector<Ids>& forced = {},
                        const Progress& progress = {}, int min_new_tokens = 0, int no_repeat_ngram_size = 0);

std::vector<std::vector<Hypothesis>> beam_search(StepSession& session, const std::vector<Ids>& sources,
                                                 const Specials& s, int beam_size, double length_penalty,
                                                 int n_best, int max_new_tokens, bool suppress_eos,
                                                 const std::vector<Ids>& forced = {},
                                                 BeamStop stop = BeamStop::n_best, const Progress& progress = {},
                                                 int min_new_tokens = 0, int no_repeat_ngram_size = 0);

// Constrained beam search, Python's search.ConstrainedBeam rule for rule (its docstring), one sentence at a time:
// constraints[i], sentence i's terms (checked: at most kMaxTerms, none empty, ids in the vocabulary); beam_size the
// beam itself (the caller's max(beam_size, 4)); limits[i] its max_new_tokens. A step's candidates per sentence are
// its 2k best, each live beam's tokens ahead (into a sequence of a term it has not met) and its best token; eos is
// out (not of the softmax) for a beam that has not met every term; the k that go on are taken by bank (terms met,
// then depth inside a sequence of one not met), the banks taking turns, fullest first. The "n_best" stopping
// rule; at its limit a sentence's live beams finish, those missing terms with Hypothesis::unmet, after the
// others. The other arguments are beam_search's.
constexpr size_t kMaxTerms = 32;  // Python's MAX_TERMS
constexpr int kConstrainedBeam = 4;  // Python's CONSTRAINED_BEAM: the least beam of a constrained sentence
std::vector<std::vector<Hypothesis>> constrained_beam_search(
    StepSession& session, const std::vector<Ids>& sources, const Specials& s, int beam_size, double length_penalty,
    int n_best, const std::vector<int>& limits, bool suppress_eos, const std::vector<Ids>& forced,
    const std::vector<Constraints>& constraints, const Progress& progress = {}, int min_new_tokens = 0,
    int no_repeat_ngram_size = 0);

// The tokens the longest way of meeting every term takes: what a constrained sentence's limit grows by (Python's
// Constraints.length).
int64_t constraints_length(const Constraints& c);

// Python's Constraints checks ("a sentence takes at most 32 terms, got 33", "a constraint term needs at least one
// sequence of at least one token"), and every id within [0, vocab): the problem, or empty.
std::string constraints_problem(const Constraints& c, int64_t vocab);

// The range a decoding option takes: `low` to `high`, both included (`low_open`: above `low`), an integer or a
// finite number (Python's Bound).
struct Bound {
  const char* name;  // the option's (Python's DecodeOptions field)
  double low, high;
  bool integer = false, low_open = false;

  bool admits(double value) const;
  std::string words() const;  // "an integer in [1, 256]", "a finite number in [-10, 10]", "... in (0, 1]"
  // Python's message for a value it does not admit, `shown` as it was given: "length_penalty must be a finite number
  // in [-10, 10], got 700" (beam_size named "beam size").
  std::string problem(const std::string& shown) const;
};

// Python's BOUNDS (twostep/runtime/decoding/options.py, whose comment says why each end is where it is), the same
// numbers: change both together. Sampling's (temperature, top_k, top_p) only refuse a manifest that Python refuses:
// this library does not sample (and so takes no seed).
constexpr int kMaxNewTokens = 1 << 20;
struct Bounds {
  Bound beam_size, n_best, length_penalty, temperature, top_k, top_p, max_new_tokens, min_new_tokens,
      no_repeat_ngram_size;
};
inline constexpr Bounds kBounds = {
    {"beam_size", 1, 256, true},
    {"n_best", 1, 256, true},  // and at most beam_size
    {"length_penalty", -10, 10},
    {"temperature", 0.01, 100},
    {"top_k", 0, 2147483647.0, true},
    {"top_p", 0, 1, false, true},
    {"max_new_tokens", 1, kMaxNewTokens, true},  // a caller's 0: automatic
    {"min_new_tokens", 0, kMaxNewTokens, true},
    {"no_repeat_ngram_size", 0, kMaxNewTokens, true},
};

// A number as Python's repr writes a float, less a trailing ".0" (700, 0.2, 1e-09, nan): the fewest digits that read
// back as `value`.
std::string number_text(double value);

// What Python's DecodeOptions refuses in `o` (its messages; none: an empty list): a value outside kBounds, n_best
// above the beam size, an unknown beam_stop; the fields it leaves out taken as twostep's defaults. `given`: a
// caller's options, where max_new_tokens 0 means automatic; else a manifest's decoding section, or the values
// Model::greedy and Model::beam_search take, refused as Python refuses them.
std::vector<std::string> option_problems(const DecodeOptions& o, bool given);
// option_problems' problems as one Error, "bad decoding options: " and each of them, "; " between; none: nothing.
void check_options(const DecodeOptions& o, bool given);

// numpy's float64 sum along a contiguous axis (pairwise, 8-way unrolled blocks of 128), so that
// log-softmax rounds like the Python loop.
double pairwise_sum(const double* a, int64_t n);

}  // namespace twostep::detail
