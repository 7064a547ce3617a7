// TextDeltas: a streamed sentence's text, shown only as far as no later token can change it.
#include "stream.h"

#include <algorithm>

namespace twostep::detail {
namespace {
const std::string kReplacement = "\xef\xbf\xbd";  // U+FFFD

bool continuation(char byte) { return (static_cast<unsigned char>(byte) & 0xC0) == 0x80; }
}  // namespace

std::string TextDeltas::next(const Ids& tokens) {
  if (tokens.empty()) return "";
  const Ids head(tokens.begin(), tokens.end() - 1);
  const std::string before = head == last_ ? last_text_ : decode_(head);
  std::string now = decode_(tokens);
  size_t n = std::mismatch(before.begin(), before.begin() + std::min(before.size(), now.size()), now.begin()).first -
             before.begin();
  n = std::min(n, now.find(kReplacement));
  while (n > 0 && n < now.size() && continuation(now[n])) --n;  // back to a character's first byte
  last_ = tokens;
  last_text_ = std::move(now);
  const std::string& text = last_text_;
  if (n <= shown_.size() || text.compare(0, shown_.size(), shown_) != 0) return "";
  std::string delta = text.substr(shown_.size(), n - shown_.size());
  shown_ += delta;
  return delta;
}

std::string TextDeltas::finish(const Ids& tokens) {
  const std::string text = decode_(tokens);
  if (text.compare(0, shown_.size(), shown_) != 0)
    throw Error("streaming: the text shown so far, '" + shown_ + "', does not begin the translation '" + text +
                "' (a bug in twostep's TextDeltas)");
  std::string delta = text.substr(shown_.size());
  shown_ = text;
  return delta;
}

}  // namespace twostep::detail
