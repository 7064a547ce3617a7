// Greedy and beam search, ported from twostep/runtime/decoding/search.py step for step (same candidate order, EOS
// handling, forced tokens, banned ids, length normalisation, done rule and max_new_tokens fallback), so both give
// the same sequences.
#include "decoding.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <tuple>

namespace twostep::detail {
namespace {
constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Max of a short run of floats, in eight independent lanes (no serial dependency between comparisons).
float block_max(const float* x, int64_t n) {
  float lanes[8];
  std::fill(lanes, lanes + 8, -std::numeric_limits<float>::infinity());
  int64_t v = 0;
  for (; v + 8 <= n; v += 8)
    for (int j = 0; j < 8; ++j) lanes[j] = x[v + j] > lanes[j] ? x[v + j] : lanes[j];
  for (; v < n; ++v) lanes[0] = x[v] > lanes[0] ? x[v] : lanes[0];
  return *std::max_element(lanes, lanes + 8);
}

// numpy's argmax of a row: the first maximum (logits are NaN-free). Finds the first block holding the
// maximum, then the maximum's place in it.
int64_t argmax(const float* row, int64_t n) {
  constexpr int64_t kBlock = 256;
  float best = -std::numeric_limits<float>::infinity();
  int64_t best_block = 0;
  for (int64_t start = 0; start < n; start += kBlock) {
    const float m = block_max(row + start, std::min(kBlock, n - start));
    if (m > best) best = m, best_block = start;
  }
  return std::find(row + best_block, row + n, best) - row;
}

// One row of Python's log_softmax(logits.astype(float64)): logp[v] = (x[v] - max) - log(sum(exp(x - max))).
// Returns {max, log-sum-exp}; the caller forms logp in that order, so that it rounds like numpy.
std::pair<double, double> log_softmax_row(const float* x, int64_t vocab, std::vector<double>& tmp) {
  const double mx = x[argmax(x, vocab)];
  tmp.resize(vocab);
  for (int64_t v = 0; v < vocab; ++v) tmp[v] = std::exp(static_cast<double>(x[v]) - mx);
  return {mx, std::log(pairwise_sum(tmp.data(), vocab))};
}

// Ids a step must not choose: -inf logits.
void ban(float* row, const Ids& banned) {
  for (int64_t id : banned) row[id] = -std::numeric_limits<float>::infinity();
}

// The first `n` finite entries of numpy's stable argsort(-total) over one sentence's k*vocab candidates,
// total = beam score + logp: descending, ties in flat-index order. -inf candidates (beams not yet alive, tokens
// forced away) are left out, as the Python loop stops at the first one; so are their rows' log-softmax. The
// `banned` ids, and each beam's `repeats` (none: empty), count in the softmax but are never candidates: set to
// -inf in `logits` (the caller's) once their row's normaliser is known, as kernels.beam_candidates does with its
// skip and banned ids.
void select_top(float* logits, const double* scores, int64_t k, int64_t vocab, const Ids& banned,
                const std::vector<Ids>& repeats, size_t n, std::vector<double>& tmp,
                std::vector<std::pair<double, int64_t>>& top) {
  top.clear();
  for (int64_t beam = 0; beam < k; ++beam) {
    if (scores[beam] == kNegInf) continue;
    float* x = logits + beam * vocab;
    const auto [mx, lse] = log_softmax_row(x, vocab, tmp);
    ban(x, banned);
    if (!repeats.empty()) ban(x, repeats[beam]);
    for (int64_t token = 0; token < vocab; ++token) {
      const double v = scores[beam] + ((static_cast<double>(x[token]) - mx) - lse);
      if (v == kNegInf || (top.size() == n && !(v > top.back().first))) continue;
      auto at = std::upper_bound(top.begin(), top.end(), v, [](double x, const auto& e) { return x > e.first; });
      top.insert(at, {v, beam * vocab + token});
      if (top.size() > n) top.pop_back();
    }
  }
}

// select_top on the search outputs of a sentence's k rows (StepSession::Search, `width` candidates a row, at
// least n + banned of them): a row's n best that are not banned are among them, in the order select_top visits
// them (largest first, equal ones lower id first), each total = score + ((logit - largest) - log_norm). A forced
// row's only candidate is its id, with log-probability 0.
void select_top_search(const StepSession::Search& search, int64_t first_row, int64_t width, const double* scores,
                       int64_t k, int64_t vocab, const Ids& banned, int64_t forced_id, size_t n,
                       std::vector<std::pair<double, int64_t>>& top) {
  top.clear();
  for (int64_t beam = 0; beam < k; ++beam) {
    if (scores[beam] == kNegInf) continue;
    const int64_t row = first_row + beam;
    const float* logits = search.top_logits + row * width;
    const int64_t* ids = search.top_ids + row * width;
    const int64_t count = forced_id >= 0 ? 1 : width;
    for (int64_t j = 0; j < count; ++j) {
      const int64_t token = forced_id >= 0 ? forced_id : ids[j];
      if (std::find(banned.begin(), banned.end(), token) != banned.end()) continue;
      const double v = forced_id >= 0 ? scores[beam] + ((0.0 - 0.0) - 0.0)
                                      : scores[beam] + ((static_cast<double>(logits[j]) - logits[0]) -
                                                        static_cast<double>(search.log_norm[row]));
      if (v == kNegInf || (top.size() == n && !(v > top.back().first))) continue;
      auto at = std::upper_bound(top.begin(), top.end(), v, [](double x, const auto& e) { return x > e.first; });
      top.insert(at, {v, beam * vocab + token});
      if (top.size() > n) top.pop_back();
    }
  }
}

// The ids a step never chooses: the model's never_generate, and eos when it is suppressed.
Ids banned_ids(const Specials& s, bool suppress_eos) {
  Ids out = s.never_generate;
  if (suppress_eos) out.push_back(s.eos_id);
  return out;
}

// The id forced on sentence `b` at step `t`, or -1 when none is.
int64_t forced_at(const std::vector<Ids>& forced, size_t b, int t) {
  return b < forced.size() && static_cast<size_t>(t) < forced[b].size() ? forced[b][t] : -1;
}

// A forced step's logits: -inf but for `id`, whose 0 becomes a log-probability of 0 (greedy picks it; a beam
// keeps its score, and the first step leaves one live beam). Banned ids are banned after it, as Python's
// RunningBatch.forcing comes before the group's step.
void force(float* row, int64_t vocab, int64_t id) {
  std::fill(row, row + vocab, -std::numeric_limits<float>::infinity());
  row[id] = 0.f;
}

// The forced ids are the caller's, not output: they leave the front of every sequence (all of a sequence
// that ended, on a forced eos, before they did).
void drop_forced(Ids& tokens, const std::vector<Ids>& forced, size_t b) {
  const size_t n = b < forced.size() ? std::min(forced[b].size(), tokens.size()) : 0;
  tokens.erase(tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(n));
}

// A row's tokens as streamed and returned: without the forced ones.
Ids shown(const Ids& tokens, const std::vector<Ids>& forced, size_t b) {
  Ids out = tokens;
  drop_forced(out, forced, b);
  return out;
}

// Eos out of a row's logits before any softmax: a sentence that has generated fewer than min_new_tokens tokens
// (Python: Group.block_early_eos, after forcing and the blocked ids).
void block_early_eos(float* row, int t, int min_new_tokens, int64_t eos_id) {
  if (t < min_new_tokens) row[eos_id] = -std::numeric_limits<float>::infinity();
}

// transformers' NoRepeatNGramLogitsProcessor (Python: kernels.repeated_ngrams): the ids that would complete an
// n-gram that [start_id, tokens...] already holds, one whose first n - 1 ids are its last n - 1 (0: none).
Ids repeated_ngrams(int64_t start_id, const Ids& tokens, int n) {
  if (n < 1) return {};
  Ids seq(1, start_id), out;
  seq.insert(seq.end(), tokens.begin(), tokens.end());
  const int64_t length = static_cast<int64_t>(seq.size());
  for (int64_t w = 0; w + n <= length; ++w)  // the n-gram seq[w, w + n)
    if (std::equal(seq.begin() + w, seq.begin() + w + n - 1, seq.end() - (n - 1))) out.push_back(seq[w + n - 1]);
  return out;
}

// Python: finished.sort(key=lambda h: -h.score) (stable); del finished[pool:]
void keep_best(std::vector<Hypothesis>& hyps, int64_t pool) {
  std::stable_sort(hyps.begin(), hyps.end(), [](const auto& a, const auto& b) { return a.score > b.score; });
  if (static_cast<int64_t>(hyps.size()) > pool) hyps.resize(pool);
}
}  // namespace

namespace {
const char* kBeamStops = "n_best, transformers, transformers_early, transformers_never, ctranslate2";
}

BeamStop beam_stop(const std::string& rule) {
  if (rule == "n_best") return BeamStop::n_best;
  if (rule == "transformers") return BeamStop::transformers;
  if (rule == "transformers_early") return BeamStop::transformers_early;
  if (rule == "transformers_never") return BeamStop::transformers_never;
  if (rule == "ctranslate2") return BeamStop::ctranslate2;
  throw Error(std::string("beam_stop must be one of ") + kBeamStops + ", got '" + rule + "'");
}

bool Bound::admits(double value) const {
  if (!std::isfinite(value) || (integer && value != std::floor(value))) return false;
  return (low_open ? low < value : low <= value) && value <= high;
}

std::string Bound::words() const {
  if (integer)
    return "an integer in [" + std::to_string(static_cast<long long>(low)) + ", " +
           std::to_string(static_cast<long long>(high)) + "]";
  char text[64];
  std::snprintf(text, sizeof text, "a finite number in %s%g, %g]", low_open ? "(" : "[", low, high);
  return text;
}

std::string Bound::problem(const std::string& shown) const {
  const std::string option = name == std::string("beam_size") ? "beam size" : name;
  return option + " must be " + words() + ", got " + shown;
}

std::string number_text(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  char text[40];
  int digits = 1;  // the fewest significant digits that read back as `value`
  for (; digits < 17; ++digits) {
    std::snprintf(text, sizeof text, "%.*e", digits - 1, value);
    if (std::strtod(text, nullptr) == value) break;
  }
  std::snprintf(text, sizeof text, "%.*e", digits - 1, value);
  const int exponent = std::atoi(std::strchr(text, 'e') + 1);
  if (exponent >= -4 && exponent < 16)  // where repr writes it without an exponent
    std::snprintf(text, sizeof text, "%.*f", std::max(0, digits - 1 - exponent), value);
  return text;
}

std::vector<std::string> option_problems(const DecodeOptions& o, bool given) {
  std::vector<std::string> out;
  const Bounds& b = kBounds;
  auto check = [&](const Bound& bound, double value, const std::string& shown) {
    if (!bound.admits(value)) out.push_back(bound.problem(shown));
  };
  const int beam = o.beam_size.value_or(1), n_best = o.n_best.value_or(1);
  check(b.beam_size, beam, std::to_string(beam));
  check(b.n_best, n_best, std::to_string(n_best));
  check(b.length_penalty, o.length_penalty.value_or(1.0), number_text(o.length_penalty.value_or(1.0)));
  if (o.max_new_tokens && !(given && *o.max_new_tokens == 0) && !b.max_new_tokens.admits(*o.max_new_tokens))
    out.push_back("max_new_tokens must be " + b.max_new_tokens.words() + (given ? " or 0 (automatic)" : "") +
                  ", got " + std::to_string(*o.max_new_tokens));
  check(b.min_new_tokens, o.min_new_tokens.value_or(0), std::to_string(o.min_new_tokens.value_or(0)));
  if (b.beam_size.admits(beam) && b.n_best.admits(n_best) && n_best > beam)
    out.push_back("n_best must be at most the beam size " + std::to_string(beam) + ", got " + std::to_string(n_best));
  const std::string rule = o.beam_stop.value_or("n_best");
  if (rule != "n_best" && rule != "transformers" && rule != "transformers_early" && rule != "transformers_never" &&
      rule != "ctranslate2")
    out.push_back(std::string("beam_stop must be one of ") + kBeamStops + ", got '" + rule + "'");
  const int ngram = o.no_repeat_ngram_size.value_or(0);
  check(b.no_repeat_ngram_size, ngram, std::to_string(ngram));
  if (given && o.batch_size < 1) out.push_back("batch size must be at least 1, got " + std::to_string(o.batch_size));
  return out;
}

void check_options(const DecodeOptions& o, bool given) {
  std::string message;
  for (const std::string& p : option_problems(o, given)) message += (message.empty() ? "" : "; ") + p;
  if (!message.empty()) throw Error("bad decoding options: " + message);
}

double pairwise_sum(const double* a, int64_t n) {
  if (n < 8) {
    double res = 0.;
    for (int64_t i = 0; i < n; ++i) res += a[i];
    return res;
  }
  if (n <= 128) {
    double r[8];
    for (int j = 0; j < 8; ++j) r[j] = a[j];
    int64_t i = 8;
    for (; i < n - (n % 8); i += 8)
      for (int j = 0; j < 8; ++j) r[j] += a[i + j];
    double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) res += a[i];
    return res;
  }
  int64_t n2 = n / 2;
  n2 -= n2 % 8;
  return pairwise_sum(a, n2) + pairwise_sum(a + n2, n - n2);
}

std::vector<Ids> greedy(StepSession& session, const std::vector<Ids>& sources, const Specials& s,
                        int max_new_tokens, bool suppress_eos, const std::vector<Ids>& forced,
                        const Progress& progress, int min_new_tokens, int no_repeat_ngram_size) {
  session.start(sources);
  const size_t batch = sources.size();
  const int64_t vocab = session.vocab();
  const Ids banned = banned_ids(s, suppress_eos);
  Ids tokens(batch, s.start_id);
  std::vector<bool> done(batch, false);
  std::vector<Ids> out(batch);
  const int64_t width = session.search_width();
  // no_repeat_ngram_size bans any number of ids a row: the full logits
  const bool outputs_suffice = width >= 1 + static_cast<int64_t>(banned.size()) && no_repeat_ngram_size == 0;
  std::vector<size_t> news;  // streaming: the rows whose shown tokens grew, or that finished, this step
  bool stopped = false;      // streaming: progress said stop
  for (int t = 0; t < max_new_tokens && !stopped; ++t) {
    const bool searching = outputs_suffice && t >= min_new_tokens;  // eos out of the softmax: the full logits
    float* logits = searching ? nullptr : session.step(tokens);
    const StepSession::Search search = searching ? session.search_step(tokens) : StepSession::Search{};
    bool all_done = true;
    for (size_t b = 0; b < batch; ++b) {
      const int64_t forced_id = forced_at(forced, b, t);
      int64_t best = forced_id;
      if (searching) {  // the first of the row's best that is not banned: argmax's pick
        for (int64_t j = 0; forced_id < 0 && j < width; ++j) {
          best = search.top_ids[b * width + j];
          if (std::find(banned.begin(), banned.end(), best) == banned.end()) break;
        }
      } else {
        float* row = logits + b * vocab;
        if (forced_id >= 0) force(row, vocab, forced_id);
        ban(row, banned);
        block_early_eos(row, t, min_new_tokens, s.eos_id);
        if (no_repeat_ngram_size > 0 && forced_id < 0)  // off: not a vector a row a step
          ban(row, repeated_ngrams(s.start_id, out[b], no_repeat_ngram_size));
        best = argmax(row, vocab);
      }
      tokens[b] = best;
      if (!done[b]) {
        if (best == s.eos_id) done[b] = true;
        else out[b].push_back(best);
        if (progress && (done[b] || forced_id < 0)) news.push_back(b);
      }
      all_done = all_done && done[b];
    }
    for (size_t i = 0; progress && !stopped && i < news.size(); ++i)
      stopped = !progress(news[i], shown(out[news[i]], forced, news[i]), done[news[i]]);
    news.clear();
    if (all_done) break;
  }
  for (size_t b = 0; b < batch; ++b) drop_forced(out[b], forced, b);
  for (size_t b = 0; progress && !stopped && b < batch; ++b)  // max_new_tokens ended them
    if (!done[b]) stopped = !progress(b, out[b], true);
  return out;
}

std::vector<std::vector<Hypothesis>> beam_search(StepSession& session, const std::vector<Ids>& sources,
                                                 const Specials& s, int beam_size, double length_penalty,
                                                 int n_best, int max_new_tokens, bool suppress_eos,
                                                 const std::vector<Ids>& forced, BeamStop stop,
                                                 const Progress& progress, int min_new_tokens,
                                                 int no_repeat_ngram_size) {
  if (n_best < 1 || n_best > beam_size)
    throw Error("n_best must be between 1 and the beam size " + std::to_string(beam_size) + ", got " +
                std::to_string(n_best));
  session.start(sources);
  const int64_t batch = static_cast<int64_t>(sources.size()), k = beam_size, vocab = session.vocab();
  const int64_t rows_n = batch * k;
  std::vector<int64_t> rows(rows_n);
  for (int64_t r = 0; r < rows_n; ++r) rows[r] = r / k;  // (B*K) rows, sentence-major
  session.expand(rows);
  std::vector<double> scores(rows_n, kNegInf);
  for (int64_t b = 0; b < batch; ++b) scores[b * k] = 0.0;  // the first step expands one beam only
  std::vector<Ids> history(rows_n);
  int64_t width = 0;  // history's length
  Ids tokens(rows_n, s.start_id);
  const Ids banned = banned_ids(s, suppress_eos);
  const bool transformers_stop = stop == BeamStop::transformers || stop == BeamStop::transformers_early ||
                                 stop == BeamStop::transformers_never;
  const bool ct2 = stop == BeamStop::ctranslate2;
  // transformers_never with length_penalty > 0: the best live hypothesis scored at the limit, where it scores best
  const bool at_limit = stop == BeamStop::transformers_never && length_penalty > 0;
  // Finished hypotheses kept per sentence (ctranslate2: all of them, until the sentence is done).
  const int64_t pool = transformers_stop ? k : ct2 ? std::numeric_limits<int64_t>::max() : n_best;
  std::vector<bool> top_ended(batch, false);  // ctranslate2: a step's best candidate has ended (sticky)
  std::vector<std::vector<Hypothesis>> finished(batch);
  std::vector<bool> done(batch, false);
  auto norm = [&](double score, int64_t length) {
    return score / std::pow(static_cast<double>(std::max<int64_t>(length, 1)), length_penalty);
  };
  std::vector<double> tmp;
  std::vector<std::pair<double, int64_t>> top;
  const int64_t search_width = session.search_width();
  // The search outputs suffice: they hold 2k candidates past the banned ids, (ctranslate2) no banned id has to
  // leave the softmax, and no n-gram bans ids row by row (Python: Beam.needs_logits).
  const bool outputs_suffice = search_width >= 2 * k + static_cast<int64_t>(banned.size()) &&
                               !(ct2 && !banned.empty()) && no_repeat_ngram_size == 0;
  std::vector<Ids> repeats;  // a sentence's beams' no_repeat_ngram_size bans
  // Streaming: a finished sentence's best hypothesis (finished[b] is sorted), as returned.
  auto best = [&](int64_t b) {
    return finished[b].empty() ? Ids{} : shown(finished[b][0].tokens, forced, static_cast<size_t>(b));
  };
  bool stopped = false;  // streaming: progress said stop

  for (int t = 0; t < max_new_tokens; ++t) {
    const bool searching = outputs_suffice && t >= min_new_tokens;  // eos out of the softmax: the full logits
    float* logits = searching ? nullptr : session.step(tokens);
    const StepSession::Search search = searching ? session.search_step(tokens) : StepSession::Search{};
    std::vector<double> next_scores(rows_n, kNegInf);
    Ids next_tokens(rows_n, s.pad_id);
    std::vector<int64_t> origins(rows_n);
    for (int64_t r = 0; r < rows_n; ++r) origins[r] = r % k;
    for (int64_t b = 0; b < batch; ++b) {
      if (done[b]) continue;
      const int64_t forced_id = forced_at(forced, static_cast<size_t>(b), t);
      if (searching) {
        select_top_search(search, b * k, search_width, &scores[b * k], k, vocab, banned, forced_id, 2 * k, top);
      } else {
        float* sentence = logits + b * k * vocab;
        for (int64_t beam = 0; beam < k; ++beam) {
          float* row = sentence + beam * vocab;
          if (forced_id >= 0) force(row, vocab, forced_id);
          if (ct2) ban(row, banned);  // out of the softmax, as CTranslate2's DisableTokens
          block_early_eos(row, t, min_new_tokens, s.eos_id);
        }
        repeats.clear();
        for (int64_t beam = 0; no_repeat_ngram_size > 0 && forced_id < 0 && beam < k; ++beam)
          repeats.push_back(repeated_ngrams(s.start_id, history[b * k + beam], no_repeat_ngram_size));
        select_top(sentence, &scores[b * k], k, vocab, ct2 ? Ids{} : banned, repeats, 2 * k, tmp, top);
      }
      if (ct2) {  // CTranslate2's step (Python: Beam.advance_ctranslate2)
        const size_t n = top.size();
        const bool last = t + 1 >= max_new_tokens;
        auto token_of = [&](size_t c) { return top[c].second % vocab; };
        auto beam_of = [&](size_t c) { return top[c].second / vocab; };
        size_t later = static_cast<size_t>(k);  // the next candidate past the beam that can take an ended slot
        bool alive = false;
        for (int64_t slot = 0; slot < k; ++slot) {
          size_t c = static_cast<size_t>(slot);  // slot s keeps candidate s, unless that one ends
          if (c < n && token_of(c) == s.eos_id) {  // only the first k can end: with their eos's score
            finished[b].push_back({history[b * k + beam_of(c)], norm(top[c].first, t + 1)});
            if (slot == 0) top_ended[b] = true;
            while (later < n && token_of(later) == s.eos_id) ++later;  // an eos past the beam finishes nothing
            c = later < n ? later++ : n;                                // none left: the slot dies
          } else if (last && c < n) {  // the limit: the first k all finish, with their new token
            Ids tokens = history[b * k + beam_of(c)];
            tokens.push_back(token_of(c));
            finished[b].push_back({std::move(tokens), norm(top[c].first, t + 1)});
          }
          if (c >= n) continue;
          next_scores[b * k + slot] = top[c].first, next_tokens[b * k + slot] = token_of(c);
          origins[b * k + slot] = beam_of(c), alive = true;
        }
        const auto count = static_cast<int64_t>(finished[b].size());
        if (last || !alive || (length_penalty == 0 ? top_ended[b] && count >= n_best : count >= k)) {
          done[b] = true;
          keep_best(finished[b], n_best);
          if (progress && !stopped) stopped = !progress(static_cast<size_t>(b), best(b), true);
        }
        continue;
      }
      int64_t kept = 0;
      for (size_t c = 0; c < top.size(); ++c) {
        const auto [score, flat] = top[c];
        const int64_t beam = flat / vocab, token = flat % vocab;
        if (token == s.eos_id) {  // transformers: only an eos among the step's k best finishes a hypothesis
          if (!transformers_stop || static_cast<int64_t>(c) < k)
            finished[b].push_back({history[b * k + beam], norm(score, t + 1)});
          continue;
        }
        next_scores[b * k + kept] = score, next_tokens[b * k + kept] = token, origins[b * k + kept] = beam;
        if (++kept == k) break;
      }
      keep_best(finished[b], pool);
      const bool full = static_cast<int64_t>(finished[b].size()) == pool;
      const double best_alive = norm(next_scores[b * k], at_limit ? max_new_tokens : t + 1);
      // transformers_early: done once full, but at the limit it still takes its live beams (after the loop)
      const bool ends = stop == BeamStop::transformers_early ? full && t + 1 < max_new_tokens
                                                             : full && finished[b].back().score >= best_alive;
      if (kept == 0 || ends) {
        done[b] = true;
        if (progress && !stopped) stopped = !progress(static_cast<size_t>(b), best(b), true);
      }
    }
    if (std::all_of(done.begin(), done.end(), [](bool d) { return d; })) break;
    for (int64_t r = 0; r < rows_n; ++r) rows[r] = (r / k) * k + origins[r];
    session.reorder(rows);
    std::vector<Ids> next_history(rows_n);
    for (int64_t r = 0; r < rows_n; ++r) {
      next_history[r] = history[rows[r]];
      next_history[r].push_back(next_tokens[r]);
    }
    history.swap(next_history);
    ++width;
    scores.swap(next_scores);
    tokens.swap(next_tokens);
    if (stopped) break;  // as if max_new_tokens ended here
  }
  for (int64_t b = 0; b < batch; ++b) {  // sentences that hit max_new_tokens: their live beams count as finished
    if (done[b]) continue;
    for (int64_t beam = 0; beam < k; ++beam)
      if (scores[b * k + beam] > kNegInf)
        finished[b].push_back({history[b * k + beam], norm(scores[b * k + beam], width)});
    keep_best(finished[b], pool);
    if (progress && !stopped) stopped = !progress(static_cast<size_t>(b), best(b), true);
  }
  for (int64_t b = 0; b < batch; ++b) {  // Python: Beam.best
    keep_best(finished[b], n_best);
    for (Hypothesis& h : finished[b]) drop_forced(h.tokens, forced, static_cast<size_t>(b));
  }
  return finished;
}


namespace {
constexpr int64_t kDepths = int64_t{1} << 20;  // a bank: terms met * kDepths + depth inside a term not met

// A sentence's terms looked up the obvious way in a hypothesis' tracked tokens (those after the forced ones), where
// Python runs an Aho-Corasick automaton: the same answers, as tests/reference_constrained.py finds them.
struct Terms {
  const Constraints& c;

  static bool ends_with(const Ids& tokens, const Ids& sequence, size_t part) {
    return part <= tokens.size() && std::equal(sequence.begin(), sequence.begin() + part, tokens.end() - part);
  }
  // The terms a sequence of which the tokens end with.
  uint64_t ending(const Ids& tokens) const {
    uint64_t mask = 0;
    for (size_t i = 0; i < c.terms.size(); ++i)
      for (const Ids& sequence : c.terms[i])
        if (ends_with(tokens, sequence, sequence.size())) mask |= uint64_t{1} << i;
    return mask;
  }
  // How deep the tokens end inside a sequence of a term not in `met`: its longest proper prefix they end with.
  int64_t depth(const Ids& tokens, uint64_t met) const {
    int64_t out = 0;
    for (size_t i = 0; i < c.terms.size(); ++i)
      for (const Ids& sequence : c.terms[i])
        for (size_t part = 1; !(met >> i & 1) && part < sequence.size(); ++part)
          if (ends_with(tokens, sequence, part)) out = std::max<int64_t>(out, static_cast<int64_t>(part));
    return out;
  }
  // The tokens that take the tokens further along a sequence of a term not in `met` (from any prefix they end
  // with, the empty one included).
  void ahead(const Ids& tokens, uint64_t met, Ids& out) const {
    out.clear();
    for (size_t i = 0; i < c.terms.size(); ++i)
      for (const Ids& sequence : c.terms[i])
        for (size_t part = 0; !(met >> i & 1) && part < sequence.size(); ++part)
          if (ends_with(tokens, sequence, part)) out.push_back(sequence[part]);
  }
};

// Python's ConstrainedBeam.keep_best: those that meet more terms first, then the best; `pool` of them.
void keep_best_constrained(std::vector<Hypothesis>& hyps, int64_t pool) {
  std::stable_sort(hyps.begin(), hyps.end(), [](const Hypothesis& a, const Hypothesis& b) {
    return a.unmet.size() != b.unmet.size() ? a.unmet.size() < b.unmet.size() : a.score > b.score;
  });
  if (static_cast<int64_t>(hyps.size()) > pool) hyps.resize(pool);
}

struct Candidate {
  double total;
  int64_t flat;  // beam * vocab + token
  int64_t bank = 0;
  uint64_t met = 0;
};
}  // namespace

int64_t constraints_length(const Constraints& c) {
  int64_t out = 0;
  for (const auto& term : c.terms) {
    size_t longest = 0;
    for (const Ids& sequence : term) longest = std::max(longest, sequence.size());
    out += static_cast<int64_t>(longest);
  }
  return out;
}

std::string constraints_problem(const Constraints& c, int64_t vocab) {
  if (c.terms.size() > kMaxTerms)
    return "a sentence takes at most " + std::to_string(kMaxTerms) + " terms, got " + std::to_string(c.terms.size());
  for (const auto& term : c.terms) {
    if (term.empty() || std::any_of(term.begin(), term.end(), [](const Ids& s) { return s.empty(); }))
      return "a constraint term needs at least one sequence of at least one token";
    for (const Ids& sequence : term)
      for (int64_t id : sequence)
        if (id < 0 || id >= vocab)
          return "a constraint has token id " + std::to_string(id) + ", outside the target vocabulary [0, " +
                 std::to_string(vocab) + ")";
  }
  return "";
}

std::vector<std::vector<Hypothesis>> constrained_beam_search(
    StepSession& session, const std::vector<Ids>& sources, const Specials& s, int beam_size, double length_penalty,
    int n_best, const std::vector<int>& limits, bool suppress_eos, const std::vector<Ids>& forced,
    const std::vector<Constraints>& constraints, const Progress& progress, int min_new_tokens,
    int no_repeat_ngram_size) {
  if (n_best < 1 || n_best > beam_size)
    throw Error("n_best must be between 1 and the beam size " + std::to_string(beam_size) + ", got " +
                std::to_string(n_best));
  if (limits.size() != sources.size() || constraints.size() != sources.size())
    throw Error("constrained beam search takes a limit and constraints for each sentence");
  for (const Constraints& c : constraints)
    if (const std::string problem = constraints_problem(c, session.vocab()); !problem.empty()) throw Error(problem);
  session.start(sources);
  const int64_t batch = static_cast<int64_t>(sources.size()), k = beam_size, vocab = session.vocab();
  const int64_t rows_n = batch * k;
  std::vector<int64_t> rows(rows_n);
  for (int64_t r = 0; r < rows_n; ++r) rows[r] = r / k;
  session.expand(rows);
  std::vector<double> scores(rows_n, kNegInf);
  for (int64_t b = 0; b < batch; ++b) scores[b * k] = 0.0;  // the first step expands one beam only
  std::vector<Ids> history(rows_n);
  std::vector<uint64_t> met(rows_n, 0);  // each row's terms met
  Ids tokens(rows_n, s.start_id);
  const Ids banned = banned_ids(s, suppress_eos);
  std::vector<Terms> terms;
  std::vector<uint64_t> every;
  for (const Constraints& c : constraints) {
    terms.push_back({c});
    every.push_back((uint64_t{1} << c.terms.size()) - 1);
  }
  std::vector<std::vector<Hypothesis>> finished(batch);
  std::vector<bool> done(batch, false);
  auto norm = [&](double score, int64_t length) {
    return score / std::pow(static_cast<double>(std::max<int64_t>(length, 1)), length_penalty);
  };
  auto best = [&](int64_t b) {
    return finished[b].empty() ? Ids{} : shown(finished[b][0].tokens, forced, static_cast<size_t>(b));
  };
  const int max_limit = limits.empty() ? 0 : *std::max_element(limits.begin(), limits.end());
  std::vector<double> tmp, top_of(k), lse_of(k);
  std::vector<std::pair<double, int64_t>> top;
  std::vector<Candidate> cands;
  Ids ahead, tail;
  bool stopped = false;

  for (int t = 0; t < max_limit; ++t) {
    float* logits = session.step(tokens);
    std::vector<double> next_scores(rows_n, kNegInf);
    Ids next_tokens(rows_n, s.pad_id);
    std::vector<uint64_t> next_met(rows_n, 0);
    std::vector<int64_t> origins(rows_n);
    for (int64_t r = 0; r < rows_n; ++r) origins[r] = r % k;
    for (int64_t b = 0; b < batch; ++b) {
      if (done[b]) continue;
      const int64_t forced_id = forced_at(forced, static_cast<size_t>(b), t);
      const bool tracking = forced_id < 0;  // the terms are tracked after the forced tokens
      const size_t skip = static_cast<size_t>(b) < forced.size() ? forced[b].size() : 0;  // untracked tokens
      auto tracked = [&](int64_t row) {
        const Ids& h = history[row];
        return Ids(h.begin() + static_cast<std::ptrdiff_t>(std::min(skip, h.size())), h.end());
      };
      float* sentence = logits + b * k * vocab;
      const double* score = &scores[b * k];
      // Each live beam's log-softmax normaliser, then its row without what it may not pick (Python's advance).
      for (int64_t beam = 0; beam < k; ++beam) {
        float* row = sentence + beam * vocab;
        if (forced_id >= 0) force(row, vocab, forced_id);
        block_early_eos(row, t, min_new_tokens, s.eos_id);
        if (score[beam] == kNegInf) continue;
        std::tie(top_of[beam], lse_of[beam]) = log_softmax_row(row, vocab, tmp);
        ban(row, banned);
        if (met[b * k + beam] != every[b]) row[s.eos_id] = -std::numeric_limits<float>::infinity();
        if (no_repeat_ngram_size > 0 && forced_id < 0)
          ban(row, repeated_ngrams(s.start_id, history[b * k + beam], no_repeat_ngram_size));
      }
      auto total_of = [&](int64_t beam, int64_t token) {
        return score[beam] + ((static_cast<double>(sentence[beam * vocab + token]) - top_of[beam]) - lse_of[beam]);
      };
      // The candidates: the sentence's 2k best, each live beam's tokens ahead and its best token; once each.
      top.clear();
      const size_t n = static_cast<size_t>(2 * k);
      cands.clear();
      for (int64_t beam = 0; beam < k; ++beam) {
        if (score[beam] == kNegInf) continue;
        for (int64_t token = 0; token < vocab; ++token) {
          const double v = total_of(beam, token);
          if (v == kNegInf || (top.size() == n && !(v > top.back().first))) continue;
          auto at = std::upper_bound(top.begin(), top.end(), v, [](double x, const auto& e) { return x > e.first; });
          top.insert(at, {v, beam * vocab + token});
          if (top.size() > n) top.pop_back();
        }
        terms[b].ahead(tracked(b * k + beam), met[b * k + beam], ahead);
        ahead.push_back(argmax(sentence + beam * vocab, vocab));
        for (int64_t token : ahead) cands.push_back({total_of(beam, token), beam * vocab + token});
      }
      for (const auto& [v, flat] : top) cands.push_back({v, flat});
      std::sort(cands.begin(), cands.end(), [](const Candidate& x, const Candidate& y) { return x.flat < y.flat; });
      cands.erase(std::unique(cands.begin(), cands.end(),
                              [](const Candidate& x, const Candidate& y) { return x.flat == y.flat; }),
                  cands.end());
      cands.erase(std::remove_if(cands.begin(), cands.end(), [](const Candidate& x) { return x.total == kNegInf; }),
                  cands.end());
      for (Candidate& c : cands) {  // its terms met and bank, the token taken
        const int64_t beam = c.flat / vocab, token = c.flat % vocab;
        tail = tracked(b * k + beam);
        if (tracking) tail.push_back(token);
        c.met = met[b * k + beam] | (tracking ? terms[b].ending(tail) : 0);
        c.bank = static_cast<int64_t>(__builtin_popcountll(c.met)) * kDepths + terms[b].depth(tail, c.met);
      }
      // eos: Beam's walk, best first (ties to the lower beam * vocab + token)
      std::sort(cands.begin(), cands.end(), [](const Candidate& x, const Candidate& y) {
        return x.total != y.total ? x.total > y.total : x.flat < y.flat;
      });
      int64_t going_before = 0;
      bool ended = false;
      for (const Candidate& c : cands) {
        if (c.flat % vocab != s.eos_id) {
          ++going_before;
        } else if (going_before < k) {
          finished[b].push_back({history[b * k + c.flat / vocab], norm(c.total, t + 1)});
          ended = true;
        }
      }
      if (ended) keep_best_constrained(finished[b], n_best);
      // The k that go on: the best, then the others best first within each bank, the banks taking turns, the
      // fullest first.
      std::vector<Candidate> on;
      for (const Candidate& c : cands)
        if (c.flat % vocab != s.eos_id) on.push_back(c);
      std::vector<Candidate> chosen;
      if (!on.empty()) {
        chosen.push_back(on.front());
        on.erase(on.begin());
      }
      std::stable_sort(on.begin(), on.end(), [](const Candidate& x, const Candidate& y) { return x.bank > y.bank; });
      std::vector<std::pair<int64_t, size_t>> turns;  // (turn, index into on)
      for (size_t i = 0; i < on.size(); ++i)
        turns.push_back({i == 0 || on[i].bank != on[i - 1].bank ? 0 : turns.back().first + 1, i});
      std::stable_sort(turns.begin(), turns.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
      for (const auto& turn : turns) chosen.push_back(on[turn.second]);
      double best_alive = kNegInf;
      for (size_t slot = 0; slot < chosen.size() && static_cast<int64_t>(slot) < k; ++slot) {
        const Candidate& c = chosen[slot];
        const int64_t r = b * k + static_cast<int64_t>(slot);
        next_scores[r] = c.total, next_tokens[r] = c.flat % vocab, origins[r] = c.flat / vocab, next_met[r] = c.met;
        best_alive = std::max(best_alive, c.total);
      }
      const bool full = static_cast<int64_t>(finished[b].size()) == n_best;
      if (chosen.empty() || (full && finished[b].back().score >= norm(best_alive, t + 1))) {
        done[b] = true;
        if (progress && !stopped) stopped = !progress(static_cast<size_t>(b), best(b), true);
      }
    }
    for (int64_t r = 0; r < rows_n; ++r) rows[r] = (r / k) * k + origins[r];
    std::vector<Ids> next_history(rows_n);
    for (int64_t r = 0; r < rows_n; ++r) {
      next_history[r] = history[rows[r]];
      next_history[r].push_back(next_tokens[r]);
    }
    history.swap(next_history);
    scores.swap(next_scores);
    met.swap(next_met);
    for (int64_t b = 0; b < batch; ++b) {  // at its limit: its live beams finish, with the terms they miss
      if (done[b] || t + 1 < limits[b]) continue;
      for (int64_t beam = 0; beam < k; ++beam) {
        const int64_t r = b * k + beam;
        if (scores[r] == kNegInf) continue;
        Hypothesis h{history[r], norm(scores[r], t + 1)};
        for (size_t i = 0; i < constraints[b].terms.size(); ++i)
          if (!(met[r] >> i & 1)) h.unmet.push_back(static_cast<int>(i));
        finished[b].push_back(std::move(h));
      }
      keep_best_constrained(finished[b], n_best);
      done[b] = true;
      if (progress && !stopped) stopped = !progress(static_cast<size_t>(b), best(b), true);
    }
    if (stopped || std::all_of(done.begin(), done.end(), [](bool d) { return d; })) break;
    session.reorder(rows);
    tokens.swap(next_tokens);
  }
  for (int64_t b = 0; b < batch; ++b) {
    if (!done[b]) {  // stopped: its live beams count as finished, as at its limit
      for (int64_t beam = 0; beam < k; ++beam) {
        const int64_t r = b * k + beam;
        if (scores[r] == kNegInf) continue;
        Hypothesis h{history[r], norm(scores[r], static_cast<int64_t>(history[r].size()))};
        for (size_t i = 0; i < constraints[b].terms.size(); ++i)
          if (!(met[r] >> i & 1)) h.unmet.push_back(static_cast<int>(i));
        finished[b].push_back(std::move(h));
      }
      keep_best_constrained(finished[b], n_best);
    }
    for (Hypothesis& h : finished[b]) drop_forced(h.tokens, forced, static_cast<size_t>(b));
  }
  return finished;
}

}  // namespace twostep::detail

namespace twostep {
DecodeOptions with_defaults(const DecodeOptions& defaults, const DecodeOptions& given) {
  DecodeOptions o = given;
  if (!o.beam_size) o.beam_size = defaults.beam_size.value_or(1);
  if (!o.length_penalty) o.length_penalty = defaults.length_penalty.value_or(1.0);
  if (!o.n_best) o.n_best = defaults.n_best.value_or(1);
  if (!o.max_new_tokens || *o.max_new_tokens == 0) o.max_new_tokens = defaults.max_new_tokens.value_or(0);
  if (!o.min_new_tokens) o.min_new_tokens = defaults.min_new_tokens.value_or(0);
  if (!o.beam_stop) o.beam_stop = defaults.beam_stop.value_or("n_best");
  if (!o.no_repeat_ngram_size) o.no_repeat_ngram_size = defaults.no_repeat_ngram_size.value_or(0);
  if (!o.replace_unknowns) o.replace_unknowns = defaults.replace_unknowns.value_or(false);
  detail::check_options(o, true);
  return o;
}
}  // namespace twostep
