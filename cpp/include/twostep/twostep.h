// twostep for C++: load an artifact directory (encoder.onnx + decoder.onnx, and decoder_inplace.onnx where it has
// one, + manifest.json + its tokenizer files) and decode with ONNX Runtime, with the same results as the Python
// runtime (twostep/runtime/).
//
//   auto model = twostep::Model::load("artifacts/demo", {/*threads*/ 2, "cpu"});
//   twostep::DecodeOptions opts;  opts.beam_size = 4;
//   std::vector<std::string> out = model.translate({"three hundred and forty-two"}, opts);
//
// A multilingual model takes its languages in the options: opts.src_lang = "en", opts.tgt_lang = "fr".
//
// Streaming: pass a StepCallback to see each sentence grow (greedy: every step; beam search: when it finishes).
//
//   model.translate({"seventy-one"}, opts, [](const twostep::StepEvent& e) {  // one sentence: its deltas in order
//     std::cout << e.delta << (e.finished ? "\n" : "") << std::flush;
//     return true;  // false: stop the call
//   });
//
// Every failure is a twostep::Error whose message names what was wrong (file, graph, sentence).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace twostep {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

using Ids = std::vector<int64_t>;

// Lowercase hex SHA-256 of a file (the digests in manifest["files"]).
std::string sha256_file(const std::filesystem::path& path);

// The language codes of a multilingual model (manifest tokenizer.languages): the ids each puts before the source
// pieces, and a target language's ids forced on the decoder after its start id. Empty for other models.
struct Languages {
  struct Target {
    Ids source;   // put before the source pieces (after the source language's)
    Ids decoder;  // forced on the decoder, one a step, after its start id
  };
  std::map<std::string, Ids> source;
  std::map<std::string, Target> target;
  std::string default_source, default_target;  // empty: none
  // Standard codes (ISO 639-1/639-3/639-2B, BCP-47 tags), lowercase with '-', to the model codes each means
  // (manifest tokenizer.languages.aliases, computed at export with Python's langcodes): "fr" -> {"fra_Latn"};
  // several: ambiguous; none: a region tag that means no code (an older artifact has no aliases: model codes only).
  std::map<std::string, std::vector<std::string>> aliases;

  // The code to use: `code`, or the default when `code` is empty; empty when none is given and the model does not
  // need one (source: none has ids, as MADLAD's; target: none has decoder ids). A code the model does not have
  // is looked up, lowercase with '-' for '_', in the aliases, then without its region (fr-CA -> fr): "fr",
  // "fra", "fre", "fr-FR" give NLLB's fra_Latn, as Python's Languages.pick does. Errors name the codes there
  // are and the example program's flag, or the candidates of an ambiguous code.
  std::string source_code(const std::string& code) const;
  std::string target_code(const std::string& code) const;
};

// How text becomes source ids and target ids become text (manifest "tokenizer"). Schema 2's single
// tokenizer.model reads as one SentencePiece model on both sides with its own ids.
struct TokenizerSpec {
  // "sentencepiece", "tokenizers": a Hugging Face tokenizer.json, or "moses-bpe": Moses tokenization and BPE
  // codes (OPUS-MT's older models); this library reads neither of the last two (text translation is refused with a
  // message; the token-id APIs work, languages included).
  std::string kind = "sentencepiece";
  std::string source_model, target_model;  // SentencePiece model files in dir (may be the same file)
  std::string source_vocab, target_vocab;  // {piece: id} JSON files in dir; empty: the SentencePiece model's ids
  Ids source_suffix;                       // appended to every source sentence (eos)
  std::vector<std::string> special_pieces;  // found anywhere in source text, each one id of the source table
  Ids drop_ids;                            // target ids left out of the text
  int64_t unk_id = 1;                      // the source id of a piece missing from source_vocab
  Ids trailing_space;                      // after a stretch of text ending in whitespace (NLLB's "▁")
  // How target pieces become text: "sentencepiece" (SentencePiece joins them, "▁" left over becomes a space, the
  // text stripped) or "argos" (as argostranslate: joined, then "▁" and "_" become spaces and one leading space
  // goes, nothing else stripped).
  std::string detokenize = "sentencepiece";
};

// A sentence's lexical constraints (a glossary's target terms; Python's decoding.constraints.Constraints): terms[i]
// is the target token sequences of which any one must appear, contiguous, somewhere in the output (the terms in any
// order). At most 32 terms, each with at least one sequence of at least one id of the target vocabulary. No terms:
// the sentence is not constrained (Python's None).
struct Constraints {
  std::vector<std::vector<Ids>> terms;
};

// How to decode. The fields that may be left "not given" (std::nullopt) take the model's decoding defaults
// (Manifest::decoding, the manifest's "decoding" section), else twostep's defaults (the values noted): Python's
// with_defaults, where a given value always wins. The ranges are Python's (twostep.runtime.decoding.options.BOUNDS:
// where the arithmetic holds); a value outside its range is an Error, "bad decoding options: ..." (with_defaults).
struct DecodeOptions {
  std::optional<int> beam_size;  // [1, 256]; 1: greedy (twostep's default)
  std::optional<double> length_penalty;  // [-10, 10]; 1.0
  std::optional<int> n_best;  // [1, 256] and at most beam_size; 1
  // [1, 2^20], capped by max_positions (as Python caps it). 0 or not given: the model's default, else 2 * longest
  // source in the batch + 16; as Python's None, a 0 given does not undo a default
  std::optional<int> max_new_tokens;
  // eos is out of the logits (out of the softmax, never picked) until a sentence has generated this many tokens,
  // forced ones included: CTranslate2's min_decoding_length ([0, 2^20]; 0)
  std::optional<int> min_new_tokens;
  bool suppress_eos = false;  // never pick eos (fixed-length decoding, for benchmarks)
  int batch_size = 32;        // sentences are sorted by length and decoded this many at a time
  // Beam search's stopping rule ("n_best"). "n_best": a sentence is done once it has n_best finished hypotheses
  // and its best live one cannot beat the worst of them. "transformers": as transformers' generate()
  // (early_stopping false): beam_size finished hypotheses kept, and only an eos among a step's beam_size best
  // candidates finishes one; what a model's transformers reference decodes. "transformers_early" (early_stopping
  // true): the same, done once it has beam_size finished hypotheses. "transformers_never" (early_stopping
  // "never"): the same, its best live one scored at max_new_tokens where length_penalty > 0. An imported
  // transformers model's default. "ctranslate2": as CTranslate2's
  // BeamSearch (patience 1): only a candidate among a step's beam_size best may finish, scored over its length
  // with its eos, and a sentence is done once it has beam_size finished hypotheses (length_penalty 0: once its
  // best candidate has ended and it has n_best), or at its limit, where the beam_size best candidates all finish;
  // ids a step never picks are out of the softmax. What a CTranslate2 model (an Argos Translate package) decodes.
  std::optional<std::string> beam_stop;
  // transformers' no_repeat_ngram_size: a token that would complete an n-gram of this size that the sentence (its
  // start id first) already holds is never picked; it stays in beam search's softmax ([0, 2^20]; 0: no such rule)
  std::optional<int> no_repeat_ngram_size;
  // After decoding, each <unk> of a hypothesis gets the source piece that the decoder's alignment (Manifest::
  // alignment: one teacher-forced run of the hypothesis) weighs most at it, among the sentence's own pieces
  // (not its language ids or suffix): Hypothesis::replacements, which the text shows in place of the <unk>
  // (CTranslate2's replace_unknowns; false). A model without the alignment output refuses it where a hypothesis
  // holds <unk>. Streamed events show the decode before the replacement.
  std::optional<bool> replace_unknowns;
  // A multilingual model's languages (Languages); empty: the model's default, if it has one. translate()
  // uses both, decode_ids() and translate_ids() tgt_lang only (for the decoder's forced tokens).
  std::string src_lang, tgt_lang;
  // Each sentence's lexical constraints, in input order (Python's decode_ids(constraints=)); empty: none, else one
  // per sentence (those with no terms decode as without). A sentence with terms is decoded by constrained beam
  // search (Python's search.ConstrainedBeam, whose docstring has the rules): beam max(beam_size, 4) (greedy
  // options too), n_best as asked, beam_stop "n_best" whatever it says; its limit (max_new_tokens, or the
  // automatic one) grown by the terms' length, the sum over terms of their longest sequence, capped by
  // max_positions; eos is not picked (it stays in the softmax) until a hypothesis holds every term; terms
  // are tracked from the first token after the forced target-language ids. Hypotheses that reach the limit
  // without every term come after those with all, with Hypothesis::unmet. Bad constraints (too many terms, an
  // empty term or sequence, an id outside the target vocabulary, a model whose decoding samples) are an Error.
  std::vector<Constraints> constraints;
};

// The options a decode runs with: `defaults` (a manifest's decoding section), each overridden by a value `given`
// gives, the rest twostep's defaults, every field set (max_new_tokens: 0 for automatic) and checked. Python:
// twostep.runtime.decoding.options.with_defaults. Errors: the given options' problems, on one line.
DecodeOptions with_defaults(const DecodeOptions& defaults, const DecodeOptions& given);

// What manifest.json says; read() checks the format, schema version and every file's sha256.
struct Manifest {
  std::filesystem::path dir;
  int64_t src_vocab_size = 0, tgt_vocab_size = 0, max_positions = 0;
  int64_t pad_id = 0, unk_id = 1, bos_id = 2, eos_id = 3;
  int64_t decoder_start_id = 2;               // each row's first decoder input (the manifest's, else bos_id)
  Ids never_generate;                         // target ids decoding never picks
  std::string dtype;                          // the graphs' float I/O: "float32" or "float16"
  std::optional<TokenizerSpec> tokenizer;     // none: token-id APIs only
  // The model's decoding defaults (the manifest's optional "decoding" section: an Argos Translate package's beam 4,
  // length_penalty 0.2, beam_stop ctranslate2, ...): what Model decodes with where a call leaves an option out.
  // Keys and values checked as Python checks them. An unset field: the section does not name it.
  DecodeOptions decoding;
  bool samples = false;  // decoding.sampling is true: sampling, which this library does not do (decoding refuses)
  Languages languages;
  std::map<std::string, std::string> files;   // name -> sha256
  struct Graph {
    std::string name, file;  // name: its key in the manifest
    std::vector<std::string> inputs, outputs;  // names, in the manifest's order
  } encoder, decoder;
  // The in-place decoder (manifest "variants"; twostep/exporter/inplace.py): the decoder's inputs and outputs, its
  // self-attention cache one buffer [batch, heads, capacity, head_dim] in and out, row r's history the first
  // past_lengths[r] positions. Of the in-place variants this library runs, the first the artifact holds, in the
  // Python ort-cpu backend's order. None: exported with --no-inplace-cache, or by an older twostep.
  std::optional<Graph> inplace;
  int64_t n_heads = 0, head_dim_k = 0, head_dim_v = 0;  // from the decoder's past_key_self_0 / past_value_self_0
  int64_t search_width = 0;  // candidates a row in the decoder's search outputs (top_ids [batch, C]); 0: none
  // The model's alignment heads (manifest model.alignment_heads, alignment_layer; a model imported from
  // CTranslate2 or Argos Translate): > 0, every decoder graph has one more output, "alignment" [batch, new_len,
  // src_len], the cross-attention of decoder layer alignment_layer averaged over its first alignment_heads heads,
  // which decoding steps never fetch and replace_unknowns reads. 0: none.
  int64_t alignment_heads = 0, alignment_layer = -1;
  bool alignment = false;  // the decoder lists the "alignment" output

  // Reads manifest.json and checks it: format, schema version, sizes, every file the runtime opens listed
  // with its sha256, every listed name a plain relative path that stays inside dir (symbolic links too),
  // and (check_hashes) every listed file's sha256.
  static Manifest read(const std::filesystem::path& dir, bool check_hashes = true);
  // The graphs' ONNX external data must be listed files too (Model::load checks it before opening them).
  void check_external_data() const;
};

// The files an ONNX graph keeps tensors in (external data "location"s), found without reading tensor data.
std::set<std::string> external_data_locations(const std::filesystem::path& graph_file);

struct Options {
  int threads = 0;               // intra-op threads; 0: ONNX Runtime's default
  std::string provider = "cpu";  // "cpu" or "cuda" (fp32 MatMuls with TF32 off, like the Python ort-cuda)
  // Keep the KV cache and cross K/V in the provider's memory between steps (Ort::IoBinding, rows reordered
  // there). Always on with "cuda"; with "cpu" it runs the same code path, which is how it is tested here.
  bool io_binding = false;
  // The decoder to decode with (Python's kv_cache). "auto": the artifact's in-place decoder (Manifest::inplace: its
  // self-attention cache one buffer that ONNX Runtime writes each step into) where it has one and the provider is
  // "cpu" without io_binding, else the plain decoder; "concat": the plain decoder (decoder.onnx, whose Concat copies
  // the whole cache every step); "inplace": the in-place one, an error where it cannot be used.
  std::string kv_cache = "auto";
};

struct Hypothesis {
  Ids tokens;    // without the start id, the forced target-language ids and eos
  double score;  // beam search: sum of log-probs / length ** length_penalty (forced tokens count); greedy: 0
  // DecodeOptions::replace_unknowns: (index into tokens, source piece) for each <unk> replaced, in token order.
  // The piece as the source text had it (Model::encode's sentences; a piece the vocabulary lacks is its own text),
  // else the source vocabulary's piece of the id. Model::decode(Hypothesis) puts them in the text.
  std::vector<std::pair<size_t, std::string>> replacements = {};
  // DecodeOptions::constraints: the indices of the sentence's terms the hypothesis does not hold (one that reached
  // the limit without them), ascending; empty: it holds every term (or the sentence has none).
  std::vector<int> unmet = {};
};

// A streamed decode's news of one sentence (Model::translate, translate_ids and decode_ids with a StepCallback).
// Greedy decoding sends one after every decoder step for each sentence whose tokens grew or that finished;
// beam search one for each sentence, when it finishes. A sentence's last event has finished set; sentences come
// in their batches' order (sorted by length, DecodeOptions::batch_size), those of a batch interleaved.
struct StepEvent {
  size_t sentence = 0;  // its index in the call's input
  Ids tokens;           // its tokens so far, as translate_ids returns them (beam search: the best hypothesis)
  // translate() only: the text it grew by since its last event, possibly none. The last token's text is held
  // back until the next token confirms it, a delta never splits a UTF-8 character, and a sentence's deltas
  // joined are exactly the text translate() returns for it.
  std::string delta;
  bool finished = false;  // its last event: tokens and text are final
};
// Returns true to go on, false to stop the call: it is not called again, and the call returns at once as if
// max_new_tokens had ended the decode after the current step (what each sentence of the running batch has so
// far: greedy, its tokens, beam search, its best hypothesis; sentences of later batches: nothing). An exception
// it throws leaves the call as it is; the Model stays usable either way.
using StepCallback = std::function<bool(const StepEvent&)>;

// The artifact's tokenizer: text to source ids, target ids to text (as twostep/runtime/tokenizer.py does).
class Tokenizer {
 public:
  // Opens the files of manifest.tokenizer; Error when the model has none.
  static Tokenizer load(const Manifest& manifest);
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Language ids + pieces + source_suffix; src_lang/tgt_lang empty: the defaults (see Languages).
  Ids encode(const std::string& text, const std::string& src_lang = "", const std::string& tgt_lang = "") const;
  std::vector<Ids> encode(const std::vector<std::string>& texts, const std::string& src_lang = "",
                          const std::string& tgt_lang = "") const;  // errors name the sentence
  // The source ids of `text` alone: special pieces as themselves, the rest through SentencePiece.
  Ids pieces(const std::string& text) const;
  // encode()'s ids, and the piece of the text each one is (empty: a language id or the suffix): SentencePiece's
  // piece, also where the vocabulary lacks it and the id is unk_id (Python's Tokenizer.source_tokens).
  std::pair<Ids, std::vector<std::string>> source_tokens(const std::string& text, const std::string& src_lang = "",
                                                         const std::string& tgt_lang = "") const;
  // The source vocabulary's piece of an id; none outside it.
  std::optional<std::string> source_piece(int64_t id) const;
  std::string decode(const Ids& ids) const;  // drop_ids left out
  // `replacements`: pieces that stand in place of the ids at those indices, kept where their id would be dropped
  // (Hypothesis::replacements).
  std::string decode(const Ids& ids, const std::vector<std::pair<size_t, std::string>>& replacements) const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// One artifact, loaded: its encoder's and decoder's ONNX Runtime sessions and tokenizer. A Model decodes one call at
// a time; use one Model per thread.
class Model {
 public:
  static Model load(const std::filesystem::path& dir, const Options& options = {});
  Model(Model&&) noexcept;
  Model& operator=(Model&&) noexcept;
  ~Model();

  const Manifest& manifest() const;
  // The graph it decodes with (Options::kv_cache): "decoder", or the in-place decoder's name ("decoder_inplace").
  const std::string& decoder() const;

  // One batch as given (no sorting, no input checks beyond the model's limits), the options in DecodeOptions' ranges
  // (max_new_tokens too: no automatic 0 here), else an Error. forced[i]: the ids forced on sentence i's decoder after
  // its start id (empty, or fewer rows than sources: none).
  std::vector<Ids> greedy(const std::vector<Ids>& sources, int max_new_tokens, bool suppress_eos = false,
                          const std::vector<Ids>& forced = {}, int min_new_tokens = 0, int no_repeat_ngram_size = 0);
  std::vector<std::vector<Hypothesis>> beam_search(const std::vector<Ids>& sources, int beam_size,
                                                   double length_penalty, int n_best, int max_new_tokens,
                                                   bool suppress_eos = false, const std::vector<Ids>& forced = {},
                                                   const std::string& beam_stop = "n_best", int min_new_tokens = 0,
                                                   int no_repeat_ngram_size = 0);

  // Token ids in (as encode() gives them: language ids, pieces, suffix), best hypotheses out, in input order,
  // decoded with with_defaults(manifest().decoding, options):
  // sorted into batches like the Python Translator, ids checked against the vocabulary and max_positions.
  // options.tgt_lang picks the ids forced on the decoder. on_step, if given, streams the decode (StepEvent,
  // no deltas); without it no step does any work for streaming. options.replace_unknowns: each hypothesis that
  // holds unk_id gets its Hypothesis::replacements (translate_ids returns the tokens alone).
  std::vector<std::vector<Hypothesis>> decode_ids(const std::vector<Ids>& sources, const DecodeOptions& options = {},
                                                  const StepCallback& on_step = {});
  std::vector<Ids> translate_ids(const std::vector<Ids>& sources, const DecodeOptions& options = {},
                                 const StepCallback& on_step = {});

  // Text in, text out, with the artifact's tokenizer (Tokenizer). on_step, if given, streams each sentence's
  // text as it grows (StepEvent::delta). encode() keeps the pieces of the latest 4,096 sentences that hold unk_id
  // (the Model's own memory), so that replace_unknowns copies a piece the vocabulary lacks as the text had it,
  // in decode_ids() too.
  Ids encode(const std::string& text, const std::string& src_lang = "", const std::string& tgt_lang = "") const;
  std::vector<Ids> encode(const std::vector<std::string>& texts, const std::string& src_lang = "",
                          const std::string& tgt_lang = "") const;  // errors name the sentence
  std::string decode(const Ids& ids) const;  // drop_ids left out
  std::string decode(const Hypothesis& hypothesis) const;  // its replacements in place of their ids
  std::vector<std::string> translate(const std::vector<std::string>& texts, const DecodeOptions& options = {},
                                     const StepCallback& on_step = {});

 private:
  struct Impl;
  explicit Model(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace twostep
