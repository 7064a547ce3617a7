// A streamed sentence's text, a delta at a time (StepEvent::delta). Internal header.
#pragma once

#include <functional>
#include <string>

#include "twostep/twostep.h"

namespace twostep::detail {

// What decode(tokens) shows that no later token can change, a delta at a time. The last token's text waits
// until the next token confirms it (only what the text before and after it agree on is shown: a byte-fallback
// piece may be the first byte of a character, a piece may read differently once followed), and so does all from
// a U+FFFD on (an incomplete UTF-8 sequence decodes to it); finish() gives the rest. The deltas joined are
// decode(final tokens), and none splits a UTF-8 character.
class TextDeltas {
 public:
  explicit TextDeltas(std::function<std::string(const Ids&)> decode) : decode_(std::move(decode)) {}
  // The text `tokens` (the sentence so far: the last call's tokens and more) add; may be empty.
  std::string next(const Ids& tokens);
  // The rest of decode(tokens), the sentence's final tokens.
  std::string finish(const Ids& tokens);

 private:
  std::function<std::string(const Ids&)> decode_;
  std::string shown_;       // the deltas so far, joined
  Ids last_;                // the tokens of the last next()
  std::string last_text_;   // decode_(last_)
};

}  // namespace twostep::detail
