"""LibreTranslate's file translation (POST /translate_file, GET /download_file/NAME) on one real `twostep serve`:
each format built by its own library, round-tripped, and its text nodes compared with what POST /translate answers
for the same nodes, its formatting with the upload's; the refusals, each with one answer, the server serving on."""

from __future__ import annotations

import io
import os
import re
import textwrap
import time
import zipfile
from datetime import timedelta

import pytest

httpx = pytest.importorskip("httpx", reason="the serving tests need httpx (pip install -e '.[dev]')")
pytest.importorskip("fastapi", reason="serving needs its extra (pip install -e '.[serve]')")
docx = pytest.importorskip("docx", reason="python-docx builds the .docx files (pip install -e '.[dev]')")
pptx = pytest.importorskip("pptx", reason="python-pptx builds the .pptx files (pip install -e '.[dev]')")
srt = pytest.importorskip("srt", reason="the .srt files need srt (pip install -e '.[serve]')")

from serving_helpers import server  # noqa: E402
from twostep.errors import BadInput  # noqa: E402
from twostep.runtime.files import FORMATS  # noqa: E402
from twostep.runtime.markup import parse_html  # noqa: E402
from twostep.serving.downloads import Downloads  # noqa: E402

LIMIT = 60_000  # bytes: python-docx's empty document is about 36 kB
A, B, C = "three hundred and forty-two", "nineteen thousand, eight hundred and seven", "six"


@pytest.fixture(scope="module")
def url(demo_artifact):
    # --max-sentences 4: a file of more nodes goes in parts, a part of more sentences is halved
    with server(demo_artifact, "--file-size-limit", LIMIT, "--max-sentences", 4) as (url, proc):
        yield url


def translated(url: str, texts: list[str]) -> list[str]:
    """POST /translate's answer for each text, one request each."""
    out = []
    for text in texts:
        r = httpx.post(f"{url}/translate", json={"q": text, "source": "en", "target": "de"}, timeout=60)
        assert r.status_code == 200, r.text
        out.append(r.json()["translatedText"])
    return out


def round_trip(url: str, name: str, data: bytes) -> bytes:
    r = httpx.post(f"{url}/translate_file", data={"source": "en", "target": "de"}, files={"file": (name, data)},
                   timeout=120)
    assert r.status_code == 200, r.text
    link = r.json()["translatedFileUrl"]
    assert re.fullmatch(re.escape(url) + r"/download_file/[0-9a-f-]{36}\." + re.escape(
        name.replace(".", "_de.", 1)), link), link
    got = httpx.get(link, timeout=60)
    assert got.status_code == 200, got.text
    assert got.headers["content-disposition"] == f'attachment; filename="{name.replace(".", "_de.", 1)}"'
    return got.content


def worth(text: str) -> bool:
    return any(ch.isalnum() for ch in text)


def test_settings_report_files_translation_as_libretranslate(url):
    settings = httpx.get(f"{url}/frontend/settings").json()
    assert settings["filesTranslation"] is True
    assert settings["supportedFilesFormat"] == [".txt", ".odt", ".odp", ".docx", ".pptx", ".epub", ".html", ".srt"]


def test_txt_lines_are_translated_and_its_line_breaks_kept(url):
    lines = [f"{A} apples.\n", "\n", f"  {B}\r\n", "--\n", f"{C}. {A}!"]
    out = round_trip(url, "notes.txt", "".join(lines).encode()).decode()
    nodes = [line.rstrip("\r\n") for line in lines if worth(line)]
    it = iter(translated(url, nodes))
    assert out == "".join(next(it) + line[len(line.rstrip("\r\n")):] if worth(line) else line for line in lines)


def test_a_file_of_more_sentences_than_a_request_takes_goes_in_parts(url):
    lines = [f"{C}. {A}.", f"{B}. {C}!", f"{A}? {B}.", f"{C}. {C}."]  # 8 sentences; a request takes 4
    out = round_trip(url, "many.txt", "\n".join(lines).encode()).decode()
    assert out.split("\n") == translated(url, lines)


def test_html_keeps_its_tags_and_translates_its_text_nodes(url):
    page = (f'<!DOCTYPE html>\n<html lang="en"><head><title>{C}</title><style>p {{color: red}}</style></head>\n'
            f'<body><p class="x">{A} <b>{B}</b> and <i>{C}</i>.</p><script>var s = "{C}";</script>'
            f'<!-- {A} --><p>{C} &amp; {C}<br>{A}</p></body></html>\n')
    out = round_trip(url, "page.html", page.encode()).decode()
    markup = parse_html(page)
    nodes = [t for t in markup.sources() if worth(t)]
    it = iter(translated(url, nodes))
    assert out == markup.join([next(it) if worth(t) else t for t in markup.sources()])
    tags = re.compile(r"<[^>]*>")
    assert tags.findall(out) == tags.findall(page)


def test_srt_keeps_its_timings_and_tags(url):
    subs = [srt.Subtitle(1, timedelta(seconds=1), timedelta(seconds=2, milliseconds=500), f"{A}\n{B}"),
            srt.Subtitle(2, timedelta(minutes=1, seconds=3), timedelta(minutes=1, seconds=4, milliseconds=20),
                         f"<i>{C}</i> {A}"),
            srt.Subtitle(3, timedelta(hours=1), timedelta(hours=1, seconds=1), "...")]
    out = list(srt.parse(round_trip(url, "film.srt", srt.compose(subs).encode()).decode()))
    assert [(s.index, s.start, s.end) for s in out] == [(s.index, s.start, s.end) for s in subs]
    first, tagged_c, tagged_a = translated(url, [f"{A} {B}", C, f" {A}"])
    assert out[0].content == textwrap.fill(first, 40)  # its lines joined, wrapped as argos-translate-files wraps
    assert out[1].content == f"<i>{tagged_c}</i>{tagged_a}"
    assert out[2].content == "..."


def runs(document) -> list[tuple]:
    """Each run of the body, its tables and its header: (text, bold, italic, its paragraph's style)."""
    paragraphs = [*document.paragraphs, *(p for t in document.tables for row in t.rows for cell in row.cells
                                          for p in cell.paragraphs), *document.sections[0].header.paragraphs]
    return [(r.text, r.bold, r.italic, r.style.name, p.style.name) for p in paragraphs for r in p.runs]


def test_docx_runs_keep_their_formatting_and_styles(url):
    document = docx.Document()
    document.add_heading(C, level=1)
    p = document.add_paragraph(f"{A} ", style="List Bullet")
    p.add_run(B).bold = True
    p.add_run(" and ")
    p.add_run(C).italic = True
    p.add_run(". " + A + ".", style="Emphasis")
    document.add_table(rows=1, cols=2).rows[0].cells[1].text = B
    document.sections[0].header.paragraphs[0].text = C
    data = io.BytesIO()
    document.save(data)
    before = runs(document)
    after = runs(docx.Document(io.BytesIO(round_trip(url, "report.docx", data.getvalue()))))
    assert [r[1:] for r in after] == [r[1:] for r in before]  # bold, italic, run and paragraph styles
    it = iter(translated(url, [r[0] for r in before if worth(r[0])]))
    assert [r[0] for r in after] == [next(it) if worth(r[0]) else r[0] for r in before]


def test_pptx_runs_keep_their_formatting(url):
    deck = pptx.Presentation()
    slide = deck.slides.add_slide(deck.slide_layouts[1])
    slide.shapes.title.text = C
    paragraph = slide.placeholders[1].text_frame.paragraphs[0]
    for text, bold in ((f"{A} ", None), (B, True)):
        run = paragraph.add_run()
        run.text, run.font.bold = text, bold
    slide.notes_slide.notes_text_frame.text = A
    data = io.BytesIO()
    deck.save(data)

    def texts(deck):
        return [(r.text, r.font.bold) for s in deck.slides for shape in [*s.shapes, *s.notes_slide.shapes]
                if shape.has_text_frame for p in shape.text_frame.paragraphs for r in p.runs]

    before = texts(deck)
    after = texts(pptx.Presentation(io.BytesIO(round_trip(url, "deck.pptx", data.getvalue()))))
    assert [bold for _, bold in after] == [bold for _, bold in before]
    assert [t for t, _ in after] == translated(url, [t for t, _ in before])


def test_odt_spans_keep_their_styles(url):
    from odf.opendocument import OpenDocumentText, load
    from odf.style import Style, TextProperties
    from odf.text import P, Span

    document = OpenDocumentText()
    bold = Style(name="Bold", family="text")
    bold.addElement(TextProperties(fontweight="bold"))
    document.automaticstyles.addElement(bold)
    p = P(text=f"{A} ")
    p.addElement(Span(stylename=bold, text=B))
    p.addText(f" {C}.")
    document.text.addElement(p)
    data = io.BytesIO()
    document.write(data)
    out = load(io.BytesIO(round_trip(url, "letter.odt", data.getvalue())))
    paragraph = out.text.getElementsByType(P)[0]
    span = paragraph.getElementsByType(Span)[0]
    assert span.getAttribute("stylename") == "Bold"
    first, inner, last = translated(url, [f"{A} ", B, f" {C}."])
    assert str(span) == inner
    assert str(paragraph) == first + inner + last


def test_epub_pages_are_translated_and_its_package_kept(url):
    page = f'<?xml version="1.0" encoding="utf-8"?>\n<html xmlns="http://www.w3.org/1999/xhtml"><body><p>{A}</p>' \
           f'<p><em>{C}</em></p></body></html>'
    data = io.BytesIO()
    with zipfile.ZipFile(data, "w", zipfile.ZIP_DEFLATED) as book:
        book.writestr(zipfile.ZipInfo("mimetype"), "application/epub+zip")  # first, stored, as EPUB requires
        book.writestr("META-INF/container.xml", "<container/>")
        book.writestr("OEBPS/chapter.xhtml", page)
    with zipfile.ZipFile(io.BytesIO(round_trip(url, "book.epub", data.getvalue()))) as out:
        first = out.infolist()[0]
        assert (first.filename, first.compress_type) == ("mimetype", zipfile.ZIP_STORED)
        assert out.read("META-INF/container.xml") == b"<container/>"
        ta, tc = translated(url, [A, C])
        assert out.read("OEBPS/chapter.xhtml").decode() == page.replace(f"<p>{A}", f"<p>{ta}").replace(
            f"<em>{C}", f"<em>{tc}")


@pytest.mark.parametrize("name, data, status, message", [
    ("scan.pdf", b"%PDF-1.7", 400, "Invalid request: file format not supported"),
    ("big.txt", b"six " * (LIMIT // 4) + b"!", 413, f"exceeds the file size limit ({LIMIT} bytes)"),
    ("broken.docx", b"PK\x03\x04 not really a zip", 400, "the file is not a valid .docx file"),
    ("", b"six", 400, "Invalid request: missing file parameter"),  # a form field without a file name: no file
])
def test_a_bad_file_gets_one_answer_and_the_server_serves_on(url, name, data, status, message):
    r = httpx.post(f"{url}/translate_file", data={"source": "en", "target": "de"}, files={"file": (name, data)},
                   timeout=60)
    assert r.status_code == status, r.text
    assert message in r.json()["error"]
    assert round_trip(url, "after.txt", C.encode()).decode() == translated(url, [C])[0]


@pytest.mark.parametrize("name", ["..%2F..%2Fetc%2Fpasswd", "%2Fetc%2Fpasswd", "..%5C..%5Cwin.ini", "%2E%2E",
                                  "x.txt"])
def test_a_download_name_the_server_does_not_make_is_refused(url, name):
    r = httpx.get(f"{url}/download_file/{name}")
    assert (r.status_code, r.json()) == (400, {"error": "Invalid filename"})


def test_a_download_that_is_gone_is_404(url):
    r = httpx.get(f"{url}/download_file/00000000-0000-4000-8000-000000000000.gone_de.txt")
    assert r.status_code == 404
    assert "No such file" in r.json()["error"]


def test_translated_files_are_removed_after_their_time(tmp_path):
    downloads = Downloads(str(tmp_path), ttl_s=60)
    old, new = downloads.store(b"1", "old.txt", "de"), downloads.store(b"2", "../new.docx", "fr")
    assert new.endswith(".new_fr.docx")
    stale = time.time() - 61
    os.utime(tmp_path / old, (stale, stale))
    (tmp_path / "kept.txt").write_bytes(b"not ours")  # a name the server does not make: left alone
    assert downloads.path(old) is None
    assert downloads.path(new).read_bytes() == b"2"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([new, "kept.txt"])
    with pytest.raises(BadInput, match="Invalid filename"):
        downloads.path("kept.txt")


def test_the_formats_are_libretranslates_but_pdf():
    assert FORMATS == (".txt", ".odt", ".odp", ".docx", ".pptx", ".epub", ".html", ".srt")
