// twostep-translate ART_DIR [options] < sentences: one translation per input line, in input order.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <limits>
#include <sstream>
#include <string>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "twostep/twostep.h"

namespace {
const char* kUsage =
    "usage: twostep-translate ART_DIR [--beam N] [--n-best N] [--length-penalty X] [--threads N]\n"
    "                         [--provider cpu|cuda] [--io-binding] [--ids] [--scores] [--max-new-tokens N]\n"
    "                         [--suppress-eos] [--batch-size N] [--warmup N --repeat N]\n"
    "                         [--beam-stop n_best|transformers|transformers_early|transformers_never|ctranslate2]\n"
    "                         [--min-new-tokens N] [--no-repeat-ngram-size N]\n"
    "                         [--src-lang CODE] [--tgt-lang CODE] [--stream] [--kv-cache auto|inplace|concat]\n"
    "                         [--replace-unknowns | --keep-unknowns] [--constraints FILE [--unmet]]\n"
    "Reads one sentence a line from stdin (with --ids: space-separated token ids ending with eos) and prints\n"
    "one line per input: the translation, or with --n-best N the N best, tab-separated (--scores: each\n"
    "preceded by its score and a space). --repeat N decodes the input N more times after --warmup runs and\n"
    "prints each run's milliseconds to stderr. --io-binding keeps the decoder state in the provider's memory\n"
    "(always so with --provider cuda). --kv-cache: the decoder (auto: the artifact's in-place one, where it has\n"
    "one, on the CPU without --io-binding; concat: the plain one). --src-lang and --tgt-lang pick a multilingual\n"
    "model's languages (with --ids only --tgt-lang counts: the source ids are taken as given). --beam-stop\n"
    "transformers stops beam search as transformers' generate() does (transformers_early, transformers_never: with\n"
    "early_stopping true, \"never\"), ctranslate2 as CTranslate2 does. --min-new-tokens N keeps eos out until N\n"
    "tokens are generated. --no-repeat-ngram-size N never repeats an n-gram of N tokens (transformers'\n"
    "no_repeat_ngram_size). --replace-unknowns puts in place of each\n"
    "<unk> the source piece the model's alignment weighs most (a model imported from CTranslate2 or Argos\n"
    "Translate); --keep-unknowns leaves them as decoded (out of the text). The decoding options not given are the\n"
    "artifact's decoding defaults (manifest.json \"decoding\"; an Argos Translate package's beam 4, ...), else\n"
    "twostep's (greedy). --stream prints the decode as it goes\n"
    "instead, one JSON object a line: {\"sentence\": I, \"delta\": TEXT, \"finished\": BOOL} (with --ids\n"
    "\"tokens\": [IDS, so far] in place of \"delta\"), I counted from 0 in input order; greedy: as each sentence\n"
    "grows, beam search: as each ends. --constraints FILE: each sentence's lexical constraints, one JSON list a\n"
    "line in input order, its terms, each a list of target token-id sequences of which one must appear in the\n"
    "output ([[[12, 7], [30]], [[25]]]; []: none), decoded by constrained beam search; --unmet then prints before\n"
    "each hypothesis (after its score) the indices of the terms it misses, [0,2] or [], and a space.\n";

// A flag's value, the whole of it: an int within int's range, or a finite double. Whether it is in the option's
// range is the library's to say (twostep::with_defaults).
template <typename T>
T parse(const std::string& flag, const std::string& value) {
  std::istringstream in(value);
  T out{};
  if (!(in >> out) || !in.eof())  // >> fails on an int beyond int's range, a double beyond double's, inf and nan
    throw twostep::Error(flag + ": expected " + (std::is_integral_v<T> ? "an integer in [" +
                         std::to_string(std::numeric_limits<T>::min()) + ", " +
                         std::to_string(std::numeric_limits<T>::max()) + "]" : std::string("a finite number")) +
                         ", got '" + value + "'");
  return out;
}

twostep::Ids parse_ids(const std::string& line, size_t number) {
  twostep::Ids ids;
  std::istringstream in(line);
  std::string word;
  while (in >> word) {
    try {
      size_t used = 0;
      ids.push_back(std::stoll(word, &used));
      if (used != word.size()) throw std::invalid_argument(word);
    } catch (const std::logic_error&) {  // std::stoll's invalid_argument and out_of_range
      throw twostep::Error("line " + std::to_string(number) + ": '" + word + "' is not a token id");
    }
  }
  return ids;
}
std::string ids_text(const twostep::Ids& ids, const std::string& separator = " ") {
  std::string out;
  for (int64_t id : ids) out += (out.empty() ? "" : separator) + std::to_string(id);
  return out;
}

// A JSON string: quotes, backslashes and control characters escaped, UTF-8 as it is.
std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\', out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\u%04x", c);
      out += escaped;
    } else {
      out += c;
    }
  }
  return out + '"';
}

// --stream's line for one event; none for a text event that shows nothing new.
bool print_event(const twostep::StepEvent& event, bool ids_mode) {
  if (!ids_mode && event.delta.empty() && !event.finished) return true;
  std::cout << "{\"sentence\": " << event.sentence << ", "
            << (ids_mode ? "\"tokens\": [" + ids_text(event.tokens, ", ") + "]" : "\"delta\": " + json_string(event.delta))
            << ", \"finished\": " << (event.finished ? "true" : "false") << "}" << std::endl;  // flushed: as it comes
  return true;
}

// --constraints' file: one sentence's terms a line, [[[ids...], ...], ...]; errors name the line.
std::vector<twostep::Constraints> read_constraints(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw twostep::Error("--constraints: cannot read " + path);
  std::vector<twostep::Constraints> out;
  size_t number = 0;
  for (std::string line; std::getline(in, line);) {
    ++number;
    try {
      const nlohmann::json terms = nlohmann::json::parse(line);
      twostep::Constraints c;
      if (!terms.is_array()) throw std::invalid_argument("not a list");
      for (const auto& term : terms) {
        if (!term.is_array()) throw std::invalid_argument("a term is not a list");
        c.terms.emplace_back();
        for (const auto& sequence : term) {
          if (!sequence.is_array()) throw std::invalid_argument("a sequence is not a list");
          c.terms.back().emplace_back();
          for (const auto& id : sequence) {
            if (!id.is_number_integer()) throw std::invalid_argument("a token id is not an integer");
            c.terms.back().back().push_back(id.get<int64_t>());
          }
        }
      }
      out.push_back(std::move(c));
    } catch (const std::exception&) {  // the JSON's and ours
      throw twostep::Error("--constraints " + path + " line " + std::to_string(number) + ": expected a list of " +
                           "terms, each a list of token-id lists ([[[12, 7], [30]], [[25]]])");
    }
  }
  return out;
}

std::string unmet_text(const std::vector<int>& unmet) {
  std::string out;
  for (int i : unmet) out += (out.empty() ? "" : ",") + std::to_string(i);
  return "[" + out + "]";
}

std::string score_text(double score) {  // round-trip precision
  char text[32];
  std::snprintf(text, sizeof text, "%.17g", score);
  return text;
}
}  // namespace

int main(int argc, char** argv) {
  try {
    std::string dir;
    twostep::Options options;
    twostep::DecodeOptions decode;
    bool ids_mode = false, scores = false, stream = false, unmet = false;
    std::string constraints;
    int warmup = 0, repeat = 0;
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      auto value = [&]() -> std::string {
        if (i + 1 >= argc) throw twostep::Error(arg + " needs a value");
        return argv[++i];
      };
      if (arg == "-h" || arg == "--help") return std::cout << kUsage, 0;
      else if (arg == "--beam") decode.beam_size = parse<int>(arg, value());
      else if (arg == "--n-best") decode.n_best = parse<int>(arg, value());
      else if (arg == "--length-penalty") decode.length_penalty = parse<double>(arg, value());
      else if (arg == "--threads") options.threads = parse<int>(arg, value());
      else if (arg == "--provider") options.provider = value();
      else if (arg == "--kv-cache") options.kv_cache = value();
      else if (arg == "--max-new-tokens") decode.max_new_tokens = parse<int>(arg, value());
      else if (arg == "--batch-size") decode.batch_size = parse<int>(arg, value());
      else if (arg == "--warmup") warmup = parse<int>(arg, value());
      else if (arg == "--repeat") repeat = parse<int>(arg, value());
      else if (arg == "--beam-stop") decode.beam_stop = value();
      else if (arg == "--min-new-tokens") decode.min_new_tokens = parse<int>(arg, value());
      else if (arg == "--no-repeat-ngram-size") decode.no_repeat_ngram_size = parse<int>(arg, value());
      else if (arg == "--src-lang") decode.src_lang = value();
      else if (arg == "--tgt-lang") decode.tgt_lang = value();
      else if (arg == "--suppress-eos") decode.suppress_eos = true;
      else if (arg == "--replace-unknowns") decode.replace_unknowns = true;
      else if (arg == "--keep-unknowns") decode.replace_unknowns = false;
      else if (arg == "--io-binding") options.io_binding = true;
      else if (arg == "--ids") ids_mode = true;
      else if (arg == "--scores") scores = true;
      else if (arg == "--stream") stream = true;
      else if (arg == "--constraints") constraints = value();
      else if (arg == "--unmet") unmet = true;
      else if (arg.rfind("-", 0) == 0 || !dir.empty()) throw twostep::Error("unexpected argument " + arg + "\n" + kUsage);
      else dir = arg;
    }
    if (dir.empty()) throw twostep::Error(std::string("missing ART_DIR\n") + kUsage);
    if (warmup < 0 || repeat < 0)
      throw twostep::Error("--warmup and --repeat take a count >= 0, got " + std::to_string(std::min(warmup, repeat)));
    twostep::Model model = twostep::Model::load(dir, options);
    // The options over the model's defaults, checked before any input is read: a value out of range is refused at once.
    const twostep::DecodeOptions checked = twostep::with_defaults(model.manifest().decoding, decode);
    if (stream && (scores || warmup || repeat || *checked.n_best > 1))
      throw twostep::Error("--stream prints the best hypothesis as it grows: not with --scores, --n-best, --warmup or "
                           "--repeat");
    std::vector<std::string> lines;
    for (std::string line; std::getline(std::cin, line);) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      lines.push_back(line);
    }
    if (!constraints.empty()) {
      decode.constraints = read_constraints(constraints);
      if (decode.constraints.size() != lines.size())
        throw twostep::Error("--constraints " + constraints + ": " + std::to_string(decode.constraints.size()) +
                             " lines for " + std::to_string(lines.size()) + " sentences");
    }
    std::vector<twostep::Ids> sources;
    for (size_t n = 0; ids_mode && n < lines.size(); ++n) sources.push_back(parse_ids(lines[n], n + 1));
    if (stream) {
      auto print = [&](const twostep::StepEvent& event) { return print_event(event, ids_mode); };
      if (ids_mode) model.translate_ids(sources, decode, print);
      else model.translate(lines, decode, print);
      return 0;
    }
    if (!ids_mode) sources = model.encode(lines, decode.src_lang, decode.tgt_lang);
    std::vector<std::vector<twostep::Hypothesis>> results;
    for (int run = 0; run < warmup + repeat + (repeat == 0); ++run) {
      const auto t0 = std::chrono::steady_clock::now();
      results = model.decode_ids(sources, decode);
      const std::chrono::duration<double, std::milli> ms = std::chrono::steady_clock::now() - t0;
      if (repeat > 0 && run >= warmup) std::fprintf(stderr, "run_ms %.3f\n", ms.count());
    }
    for (const auto& hyps : results) {
      for (size_t h = 0; h < hyps.size(); ++h) {
        if (h) std::cout << '\t';
        if (scores) std::cout << score_text(hyps[h].score) << ' ';
        if (unmet) std::cout << unmet_text(hyps[h].unmet) << ' ';
        std::cout << (ids_mode ? ids_text(hyps[h].tokens) : model.decode(hyps[h]));
      }
      std::cout << '\n';
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << '\n';
    return 1;
  }
}
