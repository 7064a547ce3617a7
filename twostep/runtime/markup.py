"""HTML in, HTML out: the text nodes of a fragment are translated, its tags, comments and attributes are kept.

`parse_html(text)` reads a fragment with the standard library's HTML parser and checks that its tags nest (a
tag that HTML lets go unclosed, as <p> or <li>, may be left open; a void one, as <br>, has no end): broken
markup is a BadInput naming the tag and where it is, not a guess. `Markup.texts` are the text nodes worth
translating (not only whitespace; not inside <script>, <style> or <code>), `Markup.join(translations)` the
fragment with each replaced, escaped again. Entities are read as the characters they stand for.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from html.parser import HTMLParser

from twostep.errors import BadInput

VOID = frozenset("area base br col embed hr img input link meta param source track wbr".split())
# may be left open: closed by their parent's end, or the fragment's (the HTML standard's optional end tags)
OPTIONAL_END = frozenset("p li dt dd option optgroup tr td th thead tbody tfoot colgroup caption rp rt rb rtc "
                         "html head body".split())
UNTRANSLATED = frozenset({"script", "style", "code", "pre", "textarea", "template"})


@dataclass(frozen=True)
class Markup:
    """A fragment as its parts in order: markup kept as written, and text nodes; `texts`: the indices of the
    text nodes to translate, in order."""

    parts: tuple[str, ...]
    texts: tuple[int, ...]

    def sources(self) -> list[str]:
        """The text nodes to translate (entities already read as characters)."""
        return [self.parts[i] for i in self.texts]

    def join(self, translations: list[str]) -> str:
        """The fragment with the text nodes replaced by `translations` (in `sources` order), escaped."""
        if len(translations) != len(self.texts):
            raise ValueError(f"{len(translations)} translations for {len(self.texts)} text nodes")
        parts = list(self.parts)
        for i, text in zip(self.texts, translations):
            parts[i] = text
        kept = set(self.texts)
        return "".join(html.escape(p, quote=False) if i in kept else p for i, p in enumerate(parts))


class _Reader(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.texts: list[int] = []
        self.open: list[tuple[str, tuple[int, int]]] = []  # tag, (line, column)

    def handle_starttag(self, tag, attrs):
        self.parts.append(self.get_starttag_text())
        if tag not in VOID:
            self.open.append((tag, self.getpos()))

    def handle_startendtag(self, tag, attrs):
        self.parts.append(self.get_starttag_text())

    def handle_endtag(self, tag):
        line, column = self.getpos()
        if tag in VOID:
            self.parts.append(f"</{tag}>")
            return
        depth = next((i for i in range(len(self.open) - 1, -1, -1) if self.open[i][0] == tag), None)
        if depth is None:
            raise BadInput(f"format html: the markup is broken: </{tag}> at line {line}, column {column + 1} closes "
                           "no open tag; send well-formed HTML, or format text")
        for inner, (at_line, at_column) in self.open[depth + 1:]:
            if inner not in OPTIONAL_END:
                raise BadInput(f"format html: the markup is broken: <{inner}> at line {at_line}, column "
                               f"{at_column + 1} is not closed before </{tag}> at line {line}, column {column + 1}; "
                               "send well-formed HTML, or format text")
        del self.open[depth:]
        self.parts.append(f"</{tag}>")

    def handle_data(self, data):  # a text node may come in pieces ("a < b"): they are joined
        if self.cdata_elem is not None:  # <script>, <style>: kept as written
            self.parts.append(data)
        elif self.texts and self.texts[-1] == len(self.parts) - 1:
            self.parts[-1] += data
        elif not any(tag in UNTRANSLATED for tag, _ in self.open):
            self.texts.append(len(self.parts))
            self.parts.append(data)
        else:
            self.parts.append(html.escape(data, quote=False))

    def markup(self) -> Markup:
        parts, texts = list(self.parts), []
        for i in self.texts:
            if parts[i].strip():
                texts.append(i)
            else:  # only whitespace: kept as it is
                parts[i] = html.escape(parts[i], quote=False)
        return Markup(tuple(parts), tuple(texts))

    def handle_comment(self, data):
        self.parts.append(f"<!--{data}-->")

    def handle_decl(self, decl):
        self.parts.append(f"<!{decl}>")

    def handle_pi(self, data):
        self.parts.append(f"<?{data}>")

    def unknown_decl(self, data):
        self.parts.append(f"<![{data}]>")


def parse_html(text: str) -> Markup:
    """A fragment's parts (see the module's docstring); BadInput where its tags do not nest or a tag is cut."""
    reader = _Reader()
    reader.feed(text)
    held = reader.rawdata  # what the parser held back: text up to an entity, or a tag not yet complete
    if held.lstrip().startswith("<"):
        cut = held.strip()
        raise BadInput(f"format html: the markup is broken: {cut[:40]!r} is not a complete tag; send well-formed "
                       "HTML, or format text")
    reader.close()
    for tag, (line, column) in reversed(reader.open):
        if tag not in OPTIONAL_END:
            raise BadInput(f"format html: the markup is broken: <{tag}> at line {line}, column {column + 1} is "
                           "never closed; send well-formed HTML, or format text")
    return reader.markup()
