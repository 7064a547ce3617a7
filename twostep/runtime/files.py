"""Files translated whole, as LibreTranslate's POST /translate_file translates them: `read(data, suffix)` finds a
file's text nodes (`Parsed.texts`), `Parsed.write(translations)` gives the file back with each node replaced and
everything else (formatting, styles, timings, markup, the other parts of a package) as it was. The caller
translates the nodes, all of a file's together (the server through its running batches, the CLI through the
Translator), each node a document of its own (split into sentences, its surrounding spaces kept).

The formats, LibreTranslate's suffixes (argos-translate-files', without .pdf):
    .txt   each line (UTF-8)
    .html  each text node (twostep.runtime.markup: the tags, attributes, scripts and styles kept)
    .srt   each subtitle's text, its lines joined and the translation wrapped at 40 characters as
           argos-translate-files does (a subtitle with tags, as <i>, keeps its lines and tags); index and timings
           kept (the `srt` library, MIT)
    .docx  each run's text (w:t) of the body, headers, footers, footnotes and endnotes: each run keeps its
           properties (bold, italic, style); nothing else of the package changes
    .pptx  each run's text (a:t) of the slides and their notes
    .odt, .odp  each text of a paragraph or heading (text:p, text:h) and of its spans, links, ... (content.xml)
    .epub  each text node of each XHTML document (as .html)

A node is translated only where it has a letter or a digit; others stay as they are.

Why these libraries: the Office formats are zip packages of XML parts, edited here with the standard library's
zipfile and lxml (BSD; already beneath sacrebleu). lxml keeps each part's namespace prefixes, which Word checks
(mc:Ignorable names them; the standard library's ElementTree renames them and Word then calls the file corrupt).
python-docx and python-pptx (MIT) read only part of a document (no text boxes, footnotes or notes in
python-docx's paragraphs) and would add nothing at run time that lxml does not do: the tests build their files
with them (and odfpy, Apache-2.0/GPL, for .odt), as a user's editor would. argos-translate-files (what
LibreTranslate uses; no licence in its metadata) pins beautifulsoup4 4.9.3, needs argostranslate and PyMuPDF
(AGPL), and translates each tag through Argos one at a time; ebooklib is AGPL, and an EPUB's XHTML needs no more
than zipfile. PDF is left out: PyMuPDF, the one library that rewrites a PDF's text in place well, is AGPL, and
the permissive ones (pypdf, pdfminer.six) read text but cannot put a translation back where it was.

Untrusted input: XML is parsed without entities or network access, a package's parts are read at most
MAX_UNPACKED bytes in all, and anything unreadable is one BadInput naming the format.
"""

from __future__ import annotations

import io
import re
import textwrap
import zipfile
from collections.abc import Callable
from dataclasses import dataclass

from lxml import etree

from twostep.errors import BadInput
from twostep.runtime.markup import parse_html

FORMATS = (".txt", ".odt", ".odp", ".docx", ".pptx", ".epub", ".html", ".srt")  # LibreTranslate's order
MAX_UNPACKED = 256 * 1024 * 1024  # a package's parts, uncompressed, in all (a zip bomb is refused)
SUBTITLE_WIDTH = 40  # argos-translate-files' textwrap.fill width

W = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
A = "http://schemas.openxmlformats.org/drawingml/2006/main"
TEXT = "urn:oasis:names:tc:opendocument:xmlns:text:1.0"
XML_SPACE = "{http://www.w3.org/XML/1998/namespace}space"


@dataclass(frozen=True)
class Parsed:
    """A file's text nodes to translate, in order, and `write(translations)`: the file's bytes with each replaced."""

    texts: list[str]
    write: Callable[[list[str]], bytes]


class Nodes:
    """The text nodes found so far, each with what puts its translation in place."""

    def __init__(self):
        self.texts: list[str] = []
        self.setters: list[Callable[[str], None]] = []

    def add(self, text: str, put: Callable[[str], None]) -> None:
        if any(ch.isalnum() for ch in text):  # else: nothing to translate (spaces, punctuation)
            self.texts.append(text)
            self.setters.append(put)

    def parsed(self, written: Callable[[], bytes]) -> Parsed:
        def write(translations: list[str]) -> bytes:
            if len(translations) != len(self.texts):
                raise ValueError(f"{len(translations)} translations for {len(self.texts)} text nodes")
            for put, text in zip(self.setters, translations):
                put(text)
            return written()

        return Parsed(list(self.texts), write)


def read(data: bytes, suffix: str) -> Parsed:
    """A file's text nodes (`suffix`: its name's, as .docx); BadInput for a format not in FORMATS, or a file that
    is not what its suffix says."""
    reader = READERS.get(suffix.lower())
    if reader is None:
        raise BadInput(f"file format {suffix or '(none)'} is not supported; supported: {', '.join(FORMATS)}")
    try:
        return reader(data)
    except BadInput:
        raise
    except (ValueError, KeyError, zipfile.BadZipFile, etree.Error) as exc:  # UnicodeDecodeError is a ValueError
        raise BadInput(f"the file is not a valid {suffix} file ({type(exc).__name__}: {exc})") from None


def decoded(data: bytes) -> tuple[str, bool]:
    """UTF-8 text (with or without a byte order mark, which is kept)."""
    bom = data.startswith(b"\xef\xbb\xbf")
    return data.decode("utf-8-sig"), bom


def encoded(text: str, bom: bool) -> bytes:
    return (b"\xef\xbb\xbf" if bom else b"") + text.encode()


def read_txt(data: bytes) -> Parsed:
    text, bom = decoded(data)
    lines = text.splitlines(keepends=True)
    nodes = Nodes()
    for i, line in enumerate(lines):
        body = line.rstrip("\r\n")
        nodes.add(body, lambda t, i=i, end=line[len(body):]: lines.__setitem__(i, t + end))
    return nodes.parsed(lambda: encoded("".join(lines), bom))


def html_nodes(text: str, nodes: Nodes) -> Callable[[], str]:
    """A page's text nodes added to `nodes`; what gives the page back with their translations."""
    markup = parse_html(text)
    out = markup.sources()
    for i, source in enumerate(out):
        nodes.add(source, lambda t, i=i: out.__setitem__(i, t))
    return lambda: markup.join(out)


def read_html(data: bytes) -> Parsed:
    text, bom = decoded(data)
    nodes = Nodes()
    page = html_nodes(text, nodes)
    return nodes.parsed(lambda: encoded(page(), bom))


def read_srt(data: bytes) -> Parsed:
    import srt

    text, bom = decoded(data)
    try:
        subtitles = list(srt.parse(text))
    except srt.SRTParseError as exc:
        raise BadInput(f"the file is not a valid .srt file: {exc}") from None
    nodes = Nodes()
    pages = []
    for sub in subtitles:
        if "<" in sub.content:  # tags (<i>, <font>): its lines and tags kept, its text nodes translated
            page = html_nodes(sub.content, nodes)
            pages.append((sub, page))
            continue

        def put(t: str, sub=sub) -> None:
            sub.content = textwrap.fill(t, SUBTITLE_WIDTH)

        nodes.add(" ".join(line.strip() for line in sub.content.splitlines() if line.strip()), put)

    def written() -> bytes:
        for sub, page in pages:
            sub.content = page()
        return encoded(srt.compose(subtitles, reindex=False), bom)

    return nodes.parsed(written)


def parser() -> etree.XMLParser:
    return etree.XMLParser(resolve_entities=False, no_network=True, remove_blank_text=False)


def read_package(data: bytes, parts: re.Pattern, find: Callable[[object, Nodes], None] | None = None,
                 markup: bool = False) -> Parsed:
    """A zip package whose parts named by `parts` hold the text: XML parts whose nodes `find` adds, or (`markup`)
    XHTML pages read as html."""
    package = zipfile.ZipFile(io.BytesIO(data))
    infos = package.infolist()
    if sum(info.file_size for info in infos) > MAX_UNPACKED:
        raise BadInput(f"the package unpacks to more than {MAX_UNPACKED} bytes")
    nodes = Nodes()
    changed: dict[str, Callable[[], bytes]] = {}
    for info in infos:
        if not parts.fullmatch(info.filename):
            continue
        raw = package.read(info)
        if markup:
            text, bom = decoded(raw)
            page = html_nodes(text, nodes)
            changed[info.filename] = lambda page=page, bom=bom: encoded(page(), bom)
        else:
            tree = etree.fromstring(raw, parser()).getroottree()
            find(tree.getroot(), nodes)
            changed[info.filename] = lambda tree=tree: etree.tostring(
                tree, xml_declaration=True, encoding=tree.docinfo.encoding or "UTF-8",
                standalone=tree.docinfo.standalone)
    if not changed:
        raise BadInput(f"the package has no part named as {parts.pattern}")

    def written() -> bytes:
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w") as rewritten:
            for info in infos:  # in order, each compressed as it was (an EPUB's mimetype first, stored)
                rewritten.writestr(info, changed[info.filename]() if info.filename in changed else package.read(info))
        return out.getvalue()

    return nodes.parsed(written)


def run_texts(tag: str) -> Callable[[object, Nodes], None]:
    """The text of each element `tag` (a run's text: w:t, a:t); a translation with outer spaces keeps them."""
    def find(root, nodes: Nodes) -> None:
        for element in root.iter(tag):
            if element.text:
                def put(t: str, element=element) -> None:
                    element.text = t
                    if tag == f"{{{W}}}t" and t != t.strip():
                        element.set(XML_SPACE, "preserve")

                nodes.add(element.text, put)

    return find


def paragraph_texts(root, nodes: Nodes) -> None:
    """OpenDocument's mixed content: each text and tail inside a paragraph or heading (text:p, text:h)."""
    paragraphs = {f"{{{TEXT}}}p", f"{{{TEXT}}}h"}

    def inside(element) -> bool:
        while element is not None:
            if element.tag in paragraphs:
                return True
            element = element.getparent()
        return False

    for element in root.iter():
        if not isinstance(element.tag, str):  # a comment or processing instruction
            continue
        if element.text and inside(element):
            nodes.add(element.text, lambda t, element=element: setattr(element, "text", t))
        if element.tail and inside(element.getparent()):
            nodes.add(element.tail, lambda t, element=element: setattr(element, "tail", t))


READERS: dict[str, Callable[[bytes], Parsed]] = {
    ".txt": read_txt,
    ".html": read_html,
    ".srt": read_srt,
    ".docx": lambda data: read_package(
        data, re.compile(r"word/(document|header\d*|footer\d*|footnotes|endnotes)\.xml"), run_texts(f"{{{W}}}t")),
    ".pptx": lambda data: read_package(
        data, re.compile(r"ppt/(slides/slide|notesSlides/notesSlide)\d+\.xml"), run_texts(f"{{{A}}}t")),
    ".odt": lambda data: read_package(data, re.compile(r"content\.xml"), paragraph_texts),
    ".odp": lambda data: read_package(data, re.compile(r"content\.xml"), paragraph_texts),
    ".epub": lambda data: read_package(data, re.compile(r".*\.(xhtml|html|htm)", re.IGNORECASE), markup=True),
}
