// Model: the artifact's step session (session.h) and the Translator's batching (twostep/runtime/translator.py);
// text goes through its Tokenizer (tokenizer.cpp).
#include <algorithm>
#include <deque>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <set>
#include <string>

#include "decoding.h"
#include "inplace.h"
#include "session.h"
#include "stream.h"
#include "twostep/twostep.h"

namespace twostep {
namespace fs = std::filesystem;
using detail::ort_errors;

namespace {
constexpr size_t kSurfaces = 4096;  // sentences whose pieces Model::encode keeps for replace_unknowns, the latest

// Whether to decode with the artifact's in-place decoder (Options::kv_cache). Python: OrtBackend's kv_cache; as its
// ort-cuda runs the plain decoder, so does the bound path here.
bool decodes_in_place(const Manifest& m, const Options& o) {
  if (o.kv_cache != "auto" && o.kv_cache != "inplace" && o.kv_cache != "concat")
    throw Error("kv_cache must be one of auto, inplace, concat, got '" + o.kv_cache + "'");
  const bool host = o.provider == "cpu" && !o.io_binding;
  if (o.kv_cache != "inplace") return o.kv_cache == "auto" && m.inplace && host;
  if (!m.inplace)
    throw Error(m.dir.string() + " has no in-place decoder: export it with `twostep export --inplace-cache`, or use "
                "kv_cache auto or concat");
  if (!host) throw Error("kv_cache inplace: the in-place decoder runs on provider cpu without io_binding");
  return true;
}
}  // namespace

struct Model::Impl {
  static std::unique_ptr<Impl> load(const fs::path& dir, const Options& options);

  Manifest m;
  Ort::Env env{ORT_LOGGING_LEVEL_WARNING, "twostep"};
  std::optional<Tokenizer> tokenizer;
  std::unique_ptr<detail::PlainSession> session;  // what the decoding loop runs (and replace_unknowns' alignment)
  std::string decoder;                            // the graph it runs: "decoder", or the in-place decoder's name
  // The pieces of encode()'s latest sentences that hold unk_id, by their ids (Python: Translator.surfaces).
  std::map<Ids, std::vector<std::string>> surfaces;
  std::deque<Ids> surface_order;  // oldest first

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
    if (m.tokenizer && m.tokenizer->kind == "moses-bpe")
      throw Error("tokenizer kind 'moses-bpe' (Moses tokenization + BPE codes) has no C++ implementation: pass token "
                  "ids (translate_ids; twostep-translate --ids), or translate text with the Python runtime "
                  "(twostep translate, twostep serve)");
    if (!tokenizer) throw Error("this model has no tokenizer: text translation needs one (token-id APIs work without)");
    return *tokenizer;
  }

  // Where `text`'s ids hold unk_id: its pieces kept, for replace_unknowns to copy a piece the vocabulary lacks.
  void keep_surfaces(const Ids& ids, const std::string& text, const std::string& src_lang,
                     const std::string& tgt_lang) {
    if (std::find(ids.begin(), ids.end(), m.unk_id) == ids.end()) return;
    auto [again, pieces] = tokenizer->source_tokens(text, src_lang, tgt_lang);
    if (again != ids) return;
    auto [at, added] = surfaces.insert_or_assign(ids, std::move(pieces));  // the latest text's pieces
    if (added) surface_order.push_back(ids);
    while (surfaces.size() > kSurfaces) surfaces.erase(surface_order.front()), surface_order.pop_front();
  }

  // Where a sentence's own pieces are among its source ids: after its language ids, before the suffix.
  // Python: Translator.source_span.
  std::pair<size_t, size_t> source_span(const Ids& ids) const {
    if (!m.tokenizer) return {0, ids.size()};
    std::set<int64_t> languages;
    for (const auto& [code, lang] : m.languages.source) languages.insert(lang.begin(), lang.end());
    for (const auto& [code, lang] : m.languages.target) languages.insert(lang.source.begin(), lang.source.end());
    size_t lead = 0;
    while (lead < ids.size() && languages.count(ids[lead])) ++lead;
    const Ids& suffix = m.tokenizer->source_suffix;
    size_t end = ids.size();
    if (!suffix.empty() && suffix.size() <= ids.size() && std::equal(suffix.begin(), suffix.end(), ids.end() - suffix.size()))
      end -= suffix.size();
    return {lead, std::max(end, lead + 1)};
  }

  // Each hypothesis holding unk_id gets its replacements, as CTranslate2 makes them: the source piece at the
  // position the decoder's alignment (one teacher-forced run of the hypothesis, apart from any batch) weighs most
  // at that token, among the sentence's own pieces. Python: Translator.replace_unknowns.
  void replace_unknowns(const std::vector<Ids>& sources, std::vector<std::vector<Hypothesis>>& results,
                        const Ids& forced) {
    for (size_t i = 0; i < sources.size(); ++i) {
      const auto [lead, end] = source_span(sources[i]);
      const auto known = surfaces.find(sources[i]);
      const size_t width = sources[i].size();
      for (Hypothesis& h : results[i]) {
        if (std::find(h.tokens.begin(), h.tokens.end(), m.unk_id) == h.tokens.end()) continue;
        Ids targets{m.decoder_start_id};
        targets.insert(targets.end(), forced.begin(), forced.end());
        targets.insert(targets.end(), h.tokens.begin(), h.tokens.end() - 1);
        const std::vector<float> alignment =
            ort_errors("replace_unknowns", [&] { return session->alignment(sources[i], targets); });
        h.replacements.clear();
        for (size_t k = 0; k < h.tokens.size(); ++k) {
          if (h.tokens[k] != m.unk_id) continue;
          const float* row = alignment.data() + (forced.size() + k) * width;
          const size_t pos = static_cast<size_t>(std::max_element(row + lead, row + end) - row);  // the first max
          std::optional<std::string> piece;
          if (known != surfaces.end()) {
            if (!known->second[pos].empty()) piece = known->second[pos];
          } else if (tokenizer) {
            piece = tokenizer->source_piece(sources[i][pos]);
          }
          if (piece) h.replacements.emplace_back(k, std::move(*piece));
        }
      }
    }
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
  detail::init_ort();
  return ort_errors(dir.string(), [&] { return Model(Impl::load(dir, options)); });
}

std::unique_ptr<Model::Impl> Model::Impl::load(const fs::path& dir, const Options& options) {
  auto impl = std::make_unique<Impl>();
  Impl& x = *impl;
  x.m = Manifest::read(dir);
  x.m.check_external_data();
  // One decoder opened: with the in-place one, decoding never runs the plain one.
  const bool inplace = decodes_in_place(x.m, options);
  x.decoder = inplace ? x.m.inplace->name : x.m.decoder.name;
  if (inplace) x.session = std::make_unique<detail::InplaceSession>(x.env, x.m, *x.m.inplace, options);
  else x.session = std::make_unique<detail::PlainSession>(x.env, x.m, x.m.decoder, options);
  if (x.m.tokenizer && x.m.tokenizer->kind == "sentencepiece") x.tokenizer = Tokenizer::load(x.m);
  return impl;
}

const Manifest& Model::manifest() const { return impl_->m; }
const std::string& Model::decoder() const { return impl_->decoder; }

std::vector<Ids> Model::greedy(const std::vector<Ids>& sources, int max_new_tokens, bool suppress_eos,
                               const std::vector<Ids>& forced, int min_new_tokens, int no_repeat_ngram_size) {
  DecodeOptions o;
  o.max_new_tokens = max_new_tokens, o.min_new_tokens = min_new_tokens, o.no_repeat_ngram_size = no_repeat_ngram_size;
  detail::check_options(o, false);
  return ort_errors("greedy", [&] {
    return detail::greedy(*impl_->session, sources, impl_->specials(), max_new_tokens, suppress_eos, forced, {},
                          min_new_tokens, no_repeat_ngram_size);
  });
}

std::vector<std::vector<Hypothesis>> Model::beam_search(const std::vector<Ids>& sources, int beam_size,
                                                        double length_penalty, int n_best, int max_new_tokens,
                                                        bool suppress_eos, const std::vector<Ids>& forced,
                                                        const std::string& beam_stop, int min_new_tokens,
                                                        int no_repeat_ngram_size) {
  DecodeOptions o;
  o.beam_size = beam_size, o.length_penalty = length_penalty, o.n_best = n_best, o.beam_stop = beam_stop;
  o.max_new_tokens = max_new_tokens, o.min_new_tokens = min_new_tokens, o.no_repeat_ngram_size = no_repeat_ngram_size;
  detail::check_options(o, false);
  const detail::BeamStop stop = detail::beam_stop(beam_stop);
  return ort_errors("beam search", [&] {
    return detail::beam_search(*impl_->session, sources, impl_->specials(), beam_size, length_penalty, n_best,
                               max_new_tokens, suppress_eos, forced, stop, {}, min_new_tokens, no_repeat_ngram_size);
  });
}

std::vector<std::vector<Hypothesis>> Model::decode_ids(const std::vector<Ids>& sources, const DecodeOptions& given,
                                                       const StepCallback& on_step) {
  const bool constrained = std::any_of(given.constraints.begin(), given.constraints.end(),
                                       [](const Constraints& c) { return !c.terms.empty(); });
  if (impl_->m.samples && constrained)  // Python: Translator.decode_ids
    throw Error("a glossary or constraints need beam search or greedy decoding, not sampling (" +
                impl_->m.dir.string() + "'s decoding defaults sample)");
  if (impl_->m.samples)
    throw Error(impl_->m.dir.string() + ": its decoding defaults sample (decoding.sampling true), which the C++ "
                "library does not do; decode it with the Python runtime");
  const DecodeOptions o = with_defaults(impl_->m.decoding, given);
  const int beam_size = *o.beam_size, max_new_tokens = *o.max_new_tokens, min_new_tokens = *o.min_new_tokens;
  const int ngram = *o.no_repeat_ngram_size;
  const detail::BeamStop stop = detail::beam_stop(*o.beam_stop);
  const Ids forced_ids = impl_->forced_ids(o.tgt_lang);
  impl_->check_ids(sources);
  const std::vector<Constraints>& constraints = o.constraints;
  if (!constraints.empty() && constraints.size() != sources.size())
    throw Error("constraints: one per sentence, got " + std::to_string(constraints.size()) + " for " +
                std::to_string(sources.size()) + " sentences");
  for (size_t i = 0; i < constraints.size(); ++i)
    if (const std::string problem = detail::constraints_problem(constraints[i], impl_->m.tgt_vocab_size);
        !problem.empty())
      throw Error("sentence " + std::to_string(i + 1) + ": " + problem);
  auto constrained_at = [&](size_t i) { return i < constraints.size() && !constraints[i].terms.empty(); };
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
    // The options' max_new_tokens, else 2 x the longest source + 16, capped by max_positions (Python's
    // Translator.max_new_tokens): a decode that would outgrow the model ends there.
    const int64_t wanted = max_new_tokens ? max_new_tokens : 2 * static_cast<int64_t>(longest) + 16;
    const int max_new = static_cast<int>(std::min<int64_t>(impl_->m.max_positions, wanted));
    // The batch's constrained sentences decode by themselves (Python: a ConstrainedBeam group of their own),
    // after the others; each row is computed as if its sentence were alone either way.
    std::vector<size_t> plain, constrained_rows;  // positions in the batch
    for (size_t i = start; i < end; ++i) (constrained_at(order[i]) ? constrained_rows : plain).push_back(i - start);
    auto rows_of = [&](const std::vector<size_t>& at) {
      std::vector<Ids> out;
      for (size_t i : at) out.push_back(batch[i]);
      return out;
    };
    auto progress_of = [&](const std::vector<size_t>& at) {  // a row's news, as the caller's sentence
      detail::Progress progress;
      if (on_step)
        progress = [&, at](size_t row, Ids tokens, bool finished) {
          StepEvent event;
          event.sentence = order[start + at[row]], event.tokens = std::move(tokens), event.finished = finished;
          stopped = !on_step(event);
          return !stopped;
        };
      return progress;
    };
    if (!plain.empty()) {
      const std::vector<Ids> part = rows_of(plain);
      const std::vector<Ids> forced(forced_ids.empty() ? 0 : part.size(), forced_ids);
      const detail::Progress progress = progress_of(plain);
      std::vector<std::vector<Hypothesis>> outs;
      if (beam_size > 1) {
        outs = ort_errors("beam search", [&] {
          return detail::beam_search(*impl_->session, part, impl_->specials(), beam_size, *o.length_penalty,
                                     *o.n_best, max_new, o.suppress_eos, forced, stop, progress, min_new_tokens,
                                     ngram);
        });
      } else {
        auto tokens = ort_errors("greedy", [&] {
          return detail::greedy(*impl_->session, part, impl_->specials(), max_new, o.suppress_eos, forced, progress,
                                min_new_tokens, ngram);
        });
        for (auto& t : tokens) outs.push_back({{std::move(t), 0.0}});
      }
      for (size_t i = 0; i < plain.size(); ++i) results[order[start + plain[i]]] = std::move(outs[i]);
    }
    if (!constrained_rows.empty() && !stopped) {
      const std::vector<Ids> part = rows_of(constrained_rows);
      const std::vector<Ids> forced(forced_ids.empty() ? 0 : part.size(), forced_ids);
      std::vector<Constraints> terms;
      std::vector<int> limits;  // Python's Translator.limits_with
      for (size_t i : constrained_rows) {
        terms.push_back(constraints[order[start + i]]);
        const int64_t grown = std::min<int64_t>(max_new + detail::constraints_length(terms.back()),
                                                impl_->m.max_positions);
        limits.push_back(static_cast<int>(std::max<int64_t>(max_new, grown)));
      }
      auto outs = ort_errors("constrained beam search", [&] {
        const int k = std::max(beam_size, detail::kConstrainedBeam);
        return detail::constrained_beam_search(*impl_->session, part, impl_->specials(), k, *o.length_penalty,
                                               *o.n_best, limits, o.suppress_eos, forced, terms,
                                               progress_of(constrained_rows), min_new_tokens, ngram);
      });
      for (size_t i = 0; i < constrained_rows.size(); ++i)
        results[order[start + constrained_rows[i]]] = std::move(outs[i]);
    }
  }
  if (*o.replace_unknowns) impl_->replace_unknowns(sources, results, forced_ids);
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
  Ids ids = impl_->text_tokenizer().encode(text, src_lang, tgt_lang);
  impl_->keep_surfaces(ids, text, src_lang, tgt_lang);
  return ids;
}
std::vector<Ids> Model::encode(const std::vector<std::string>& texts, const std::string& src_lang,
                               const std::string& tgt_lang) const {
  std::vector<Ids> out = impl_->text_tokenizer().encode(texts, src_lang, tgt_lang);
  for (size_t i = 0; i < out.size(); ++i) impl_->keep_surfaces(out[i], texts[i], src_lang, tgt_lang);
  return out;
}
std::string Model::decode(const Ids& ids) const { return impl_->text_tokenizer().decode(ids); }
std::string Model::decode(const Hypothesis& hypothesis) const {
  return impl_->text_tokenizer().decode(hypothesis.tokens, hypothesis.replacements);
}

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
  for (const auto& hyps : decode_ids(sources, options, with_deltas))
    out.push_back(hyps.empty() ? decode(Ids{}) : decode(hyps[0]));
  return out;
}

}  // namespace twostep
