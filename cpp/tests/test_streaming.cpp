// Streaming (StepCallback): the text deltas (TextDeltas, on made-up decoders), the decoding loop's news (on a
// scripted StepSession), and, where TWOSTEP_TEST_ARTIFACT names an artifact with a tokenizer (tests/cpp passes
// the demo model's), a real Model: deltas joined = translate()'s text, greedy and beam, and a clean stop.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "decoding.h"
#include "scripted_session.h"
#include "stream.h"
#include "twostep/twostep.h"

using twostep::Ids;

namespace {
// Whether `text` is whole UTF-8 characters (no sequence cut short, no stray continuation byte).
bool whole_utf8(const std::string& text) {
  for (size_t i = 0; i < text.size();) {
    const auto lead = static_cast<unsigned char>(text[i]);
    const size_t n = lead < 0x80 ? 1 : (lead >> 5) == 0x6 ? 2 : (lead >> 4) == 0xE ? 3 : (lead >> 3) == 0x1E ? 4 : 0;
    if (n == 0 || i + n > text.size()) return false;
    for (size_t j = 1; j < n; ++j)
      if ((static_cast<unsigned char>(text[i + j]) & 0xC0) != 0x80) return false;
    i += n;
  }
  return true;
}

// A byte-fallback tokenizer's decoder: each token one byte, an incomplete or invalid sequence one U+FFFD a byte
// (as SentencePiece decodes byte pieces), spaces stripped at both ends.
std::string bytes_decode(const Ids& ids) {
  std::string raw;
  for (int64_t id : ids) raw += static_cast<char>(id);
  std::string out;
  for (size_t i = 0; i < raw.size();) {
    size_t n = 1;
    while (n <= 4 && i + n <= raw.size() && !whole_utf8(raw.substr(i, n))) ++n;
    if (n > 4 || i + n > raw.size()) out += "\xef\xbf\xbd", n = 1;
    else out += raw.substr(i, n);
    i += n;
  }
  const size_t begin = out.find_first_not_of(' '), end = out.find_last_not_of(' ');
  return begin == std::string::npos ? "" : out.substr(begin, end - begin + 1);
}

Ids bytes_of(const std::string& text) {
  Ids ids;
  for (char c : text) ids.push_back(static_cast<unsigned char>(c));
  return ids;
}

// Streams `ids` one more token a call; returns the deltas, the last from finish().
std::vector<std::string> stream(twostep::detail::TextDeltas& deltas, const Ids& ids) {
  std::vector<std::string> out;
  for (size_t n = 1; n <= ids.size(); ++n) out.push_back(deltas.next(Ids(ids.begin(), ids.begin() + n)));
  out.push_back(deltas.finish(ids));
  return out;
}

std::string joined(const std::vector<std::string>& parts) {
  std::string out;
  for (const std::string& part : parts) out += part;
  return out;
}
}  // namespace

TEST_CASE("text deltas: a token's text waits for the next token, then shows") {
  // SentencePiece-like pieces: "▁" a space, the text's ends stripped.
  const std::map<int64_t, std::string> pieces = {{1, " he"}, {2, "llo"}, {3, " world"}, {4, " "}};
  twostep::detail::TextDeltas deltas([&](const Ids& ids) {
    std::string text;
    for (int64_t id : ids) text += pieces.at(id);
    const size_t begin = text.find_first_not_of(' '), end = text.find_last_not_of(' ');
    return begin == std::string::npos ? std::string() : text.substr(begin, end - begin + 1);
  });
  CHECK(deltas.next({1}) == "");
  CHECK(deltas.next({1, 2}) == "he");
  CHECK(deltas.next({1, 2, 3}) == "llo");
  CHECK(deltas.next({1, 2, 3, 4}) == " world");
  CHECK(deltas.finish({1, 2, 3, 4}) == "");  // the trailing space is stripped, as translate() strips it
}

TEST_CASE("text deltas: byte-fallback tokens never split a character, and join to the text") {
  const std::string text = "h\xc3\xa9llo w\xc3\xb6rld \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80!";  // héllo wörld 日本 😀!
  const Ids ids = bytes_of(text);
  twostep::detail::TextDeltas deltas(bytes_decode);
  const std::vector<std::string> parts = stream(deltas, ids);
  CHECK(joined(parts) == text);
  for (const std::string& part : parts) {
    CAPTURE(part);
    CHECK(whole_utf8(part));
    CHECK(part.find("\xef\xbf\xbd") == std::string::npos);
  }
  // The 4-byte character shows once its last byte is followed by another token; nothing of it before.
  const size_t smiley = text.find("\xf0");
  CHECK(joined(std::vector<std::string>(parts.begin(), parts.begin() + smiley + 4)) == text.substr(0, smiley));
  CHECK(parts[smiley + 4] == "\xf0\x9f\x98\x80");
}

TEST_CASE("text deltas: text a later token rewrites is not shown until it stands; a real U+FFFD at the end") {
  // Token 2 turns the "e" before it into "é" (as a piece that merges with the one before might).
  twostep::detail::TextDeltas deltas([](const Ids& ids) {
    std::string text;
    for (int64_t id : ids) {
      if (id == 2 && !text.empty() && text.back() == 'e') text.replace(text.size() - 1, 1, "\xc3\xa9");
      else text += id == 1 ? "ab e" : id == 3 ? "x" : "";
    }
    return text;
  });
  CHECK(deltas.next({1}) == "");
  CHECK(deltas.next({1, 2}) == "ab ");  // "ab e" and "ab é" agree on "ab " only
  CHECK(deltas.next({1, 2, 3}) == "\xc3\xa9");
  CHECK(deltas.finish({1, 2, 3}) == "x");

  // An invalid byte in the final text: its U+FFFD and what follows wait for finish().
  twostep::detail::TextDeltas invalid(bytes_decode);
  const Ids ids = {'a', 0xff, 'b', 'c'};
  const std::vector<std::string> parts = stream(invalid, ids);
  CHECK(parts == std::vector<std::string>{"", "a", "", "", "\xef\xbf\xbd" "bc"});
}

// --- the decoding loop's news, on a scripted session

namespace {
struct News {
  size_t row;
  Ids tokens;
  bool finished;
  bool operator==(const News& o) const { return row == o.row && tokens == o.tokens && finished == o.finished; }
};

std::ostream& operator<<(std::ostream& out, const News& n) {
  out << "{" << n.row << ", [";
  for (int64_t id : n.tokens) out << id << " ";
  return out << "], " << (n.finished ? "finished" : "") << "}";
}

// A Progress that records, and says stop at its `stop_at`-th call (0: never).
twostep::detail::Progress recorder(std::vector<News>& news, size_t stop_at = 0) {
  return [&news, stop_at](size_t row, Ids tokens, bool finished) {
    news.push_back({row, std::move(tokens), finished});
    return news.size() != stop_at;
  };
}
}  // namespace

TEST_CASE("greedy streams each step's news: forced tokens not shown, every row finished once") {
  ScriptedSession session;
  const std::vector<Ids> sources = {{5, 3}, {6, 3}};
  const std::vector<Ids> forced = {{kForced}, {}};
  std::vector<News> news;
  const auto out = twostep::detail::greedy(session, sources, kSpecials, 10, false, forced, recorder(news));
  CHECK(out == std::vector<Ids>{{5}, {4, 5}});
  // Step 0: row 0 is forced (nothing shown). Step 2: eos ends both.
  CHECK(news == std::vector<News>{{1, {4}, false}, {0, {5}, false}, {1, {4, 5}, false}, {0, {5}, true},
                                  {1, {4, 5}, true}});

  SUBCASE("max_new_tokens ends them: a finished event each after the last step") {
    news.clear();
    CHECK(twostep::detail::greedy(session, sources, kSpecials, 2, false, forced, recorder(news)) == out);
    CHECK(news == std::vector<News>{{1, {4}, false}, {0, {5}, false}, {1, {4, 5}, false}, {0, {5}, true},
                                    {1, {4, 5}, true}});
  }
  SUBCASE("false stops after that step: no more news, no more steps, what each row has so far") {
    news.clear();
    CHECK(twostep::detail::greedy(session, sources, kSpecials, 10, false, forced, recorder(news, 2)) ==
          std::vector<Ids>{{5}, {4, 5}});
    CHECK(news.size() == 2);
    CHECK(session.fed.size() == 2);
    news.clear();
    CHECK(twostep::detail::greedy(session, sources, kSpecials, 10, false, {}, recorder(news, 1)) ==
          std::vector<Ids>{{4}, {4}});
    CHECK(news == std::vector<News>{{0, {4}, false}});
    CHECK(session.fed.size() == 1);
  }
}

TEST_CASE("beam search streams each sentence once, when it ends, with its best hypothesis") {
  ScriptedSession session;
  const std::vector<Ids> sources = {{5, 3}, {6, 3}};
  const std::vector<Ids> forced = {{kForced}, {}};
  for (int max_new : {10, 2}) {  // 2: max_new_tokens ends them
    CAPTURE(max_new);
    std::vector<News> news;
    const auto out = twostep::detail::beam_search(session, sources, kSpecials, 2, 1.0, 2, max_new, false, forced,
                                                  twostep::detail::BeamStop::n_best, recorder(news));
    REQUIRE(news.size() == 2);
    for (const News& n : news) {
      CHECK(n.finished);
      CHECK(n.tokens == out[n.row][0].tokens);
    }
    CHECK(news[0].row != news[1].row);
  }
  std::vector<News> news;
  const auto stopped = twostep::detail::beam_search(session, sources, kSpecials, 2, 1.0, 1, 10, false, forced,
                                                    twostep::detail::BeamStop::n_best, recorder(news, 1));
  CHECK(news.size() == 1);
  CHECK(stopped.size() == 2);
  CHECK(stopped[news[0].row][0].tokens == news[0].tokens);
}

// --- a real model: TWOSTEP_TEST_ARTIFACT (the demo model's artifact, from tests/cpp/test_cpp.py)

namespace {
const char* const kArtifact = std::getenv("TWOSTEP_TEST_ARTIFACT");
const std::vector<std::string> kSentences = {
    "three hundred and forty-two", "seventy-one", "nineteen", "one thousand two hundred and five", "eight",
    "six hundred", "ninety-nine thousand nine hundred and ninety-nine"};

struct Streamed {
  std::vector<std::vector<twostep::StepEvent>> events;  // each sentence's, in order
  std::vector<std::string> out;                         // what translate() returned
};

Streamed translate_streamed(twostep::Model& model, const twostep::DecodeOptions& options, size_t stop_at = 0) {
  Streamed s;
  s.events.resize(kSentences.size());
  size_t calls = 0;
  s.out = model.translate(kSentences, options, [&](const twostep::StepEvent& event) {
    s.events.at(event.sentence).push_back(event);
    return ++calls != stop_at;
  });
  return s;
}
}  // namespace

TEST_CASE("streaming on a model: deltas join to translate()'s text, greedy and beam" * doctest::skip(!kArtifact)) {
  twostep::Model model = twostep::Model::load(kArtifact, {1, "cpu"});
  for (int beam : {1, 4}) {
    CAPTURE(beam);
    twostep::DecodeOptions options;
    options.beam_size = beam;
    options.batch_size = 3;  // three batches, sorted by length
    const std::vector<std::string> plain = model.translate(kSentences, options);
    const std::vector<Ids> ids = model.translate_ids(model.encode(kSentences), options);
    const Streamed s = translate_streamed(model, options);
    CHECK(s.out == plain);
    for (size_t i = 0; i < kSentences.size(); ++i) {
      CAPTURE(kSentences[i]);
      const auto& events = s.events[i];
      REQUIRE(!events.empty());
      std::string text;
      for (size_t e = 0; e < events.size(); ++e) {
        CHECK(events[e].finished == (e + 1 == events.size()));
        CHECK(whole_utf8(events[e].delta));
        text += events[e].delta;
      }
      CHECK(text == plain[i]);
      CHECK(events.back().tokens == ids[i]);
      if (beam > 1) {
        CHECK(events.size() == 1);
      } else {  // a token a step, then eos (or max_new_tokens): the tokens so far each time
        CHECK(events.size() == ids[i].size() + 1);
        for (size_t e = 0; e + 1 < events.size(); ++e) CHECK(events[e].tokens == Ids(ids[i].begin(), ids[i].begin() + e + 1));
      }
    }
  }
}

TEST_CASE("streaming on a model: false stops the call cleanly; a throw leaves it" * doctest::skip(!kArtifact)) {
  twostep::Model model = twostep::Model::load(kArtifact, {1, "cpu"});
  for (int beam : {1, 4}) {
    CAPTURE(beam);
    twostep::DecodeOptions options;
    options.beam_size = beam;
    options.batch_size = 3;
    const std::vector<std::string> plain = model.translate(kSentences, options);
    const Streamed s = translate_streamed(model, options, 1);  // stop at the first event
    size_t events = 0, with_text = 0;
    for (const auto& e : s.events) events += e.size();
    CHECK(events == 1);
    REQUIRE(s.out.size() == kSentences.size());
    for (const std::string& text : s.out) with_text += !text.empty();
    CHECK(with_text >= 1);
    CHECK(with_text <= 3);  // the first batch's, no more
    // The model goes on as before.
    CHECK(model.translate(kSentences, options) == plain);

    CHECK_THROWS_WITH_AS(model.translate(kSentences, options, [](const twostep::StepEvent&) -> bool {
      throw std::runtime_error("the caller's own");
    }), "the caller's own", std::runtime_error);
    CHECK(model.translate(kSentences, options) == plain);
  }
  // translate_ids streams tokens, no text.
  std::vector<twostep::StepEvent> events;
  const auto ids = model.translate_ids(model.encode(kSentences), {}, [&](const twostep::StepEvent& e) {
    events.push_back(e);
    return true;
  });
  for (const auto& e : events) CHECK(e.delta.empty());
  CHECK(static_cast<size_t>(std::count_if(events.begin(), events.end(), [](const auto& e) { return e.finished; })) ==
        kSentences.size());
}
