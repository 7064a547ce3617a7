"""twostep.runtime.files without a model: what a format counts as a text node, what it keeps byte for byte, and
what it refuses (each a BadInput naming the format), with an upper-casing stand-in for the translation."""

from __future__ import annotations

import io
import zipfile

import pytest

from twostep.errors import BadInput
from twostep.runtime import files


def upper(data: bytes, suffix: str) -> tuple[list[str], bytes]:
    parsed = files.read(data, suffix)
    return parsed.texts, parsed.write([t.upper() for t in parsed.texts])


def test_txt_keeps_its_byte_order_mark_line_ends_and_lines_without_words():
    texts, out = upper(b"\xef\xbb\xbfsix apples\r\n\r\n -- \n  seven.", ".txt")
    assert texts == ["six apples", "  seven."]  # a line without a letter or digit is no node
    assert out == b"\xef\xbb\xbfSIX APPLES\r\n\r\n -- \n  SEVEN."


def test_a_run_with_outer_spaces_keeps_them_in_word():
    w = files.W
    part = (f'<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n<w:document xmlns:w="{w}" '
            f'xmlns:mc="http://schemas.openxmlformats.org/markup-compatibility/2006" mc:Ignorable="w"><w:body><w:p>'
            f'<w:r><w:t>six</w:t></w:r><w:r><w:rPr><w:b/></w:rPr><w:t>seven</w:t></w:r></w:p></w:body></w:document>')
    package = io.BytesIO()
    with zipfile.ZipFile(package, "w") as z:
        z.writestr("word/document.xml", part)
        z.writestr("word/styles.xml", "<styles/>")
    parsed = files.read(package.getvalue(), ".docx")
    assert parsed.texts == ["six", "seven"]
    with zipfile.ZipFile(io.BytesIO(parsed.write([" six ", "SEVEN"]))) as z:
        out = z.read("word/document.xml").decode()
        assert z.read("word/styles.xml") == b"<styles/>"
    assert out.startswith('<?xml version=\'1.0\' encoding=\'UTF-8\' standalone=\'yes\'?>')
    assert 'xmlns:w="' in out and 'mc:Ignorable="w"' in out  # the prefixes Word checks, as they were
    assert '<w:t xml:space="preserve"> six </w:t>' in out and "<w:rPr><w:b/></w:rPr><w:t>SEVEN</w:t>" in out


def test_xml_entities_are_not_read():
    part = ('<?xml version="1.0"?><!DOCTYPE d [<!ENTITY x SYSTEM "file:///etc/hostname">]>'
            f'<w:document xmlns:w="{files.W}"><w:body><w:p><w:r><w:t>six &x;</w:t></w:r></w:p></w:body></w:document>')
    package = io.BytesIO()
    with zipfile.ZipFile(package, "w") as z:
        z.writestr("word/document.xml", part)
    assert files.read(package.getvalue(), ".docx").texts == ["six "]


def test_a_package_that_unpacks_too_large_is_refused(monkeypatch):
    package = io.BytesIO()
    with zipfile.ZipFile(package, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("content.xml", "<a>" + " " * 10_000 + "</a>")
    monkeypatch.setattr(files, "MAX_UNPACKED", 5_000)
    with pytest.raises(BadInput, match="unpacks to more than 5000 bytes"):
        files.read(package.getvalue(), ".odt")


@pytest.mark.parametrize("data, suffix, message", [
    (b"six", ".pdf", "file format .pdf is not supported; supported: .txt, .odt"),
    (b"\xff six", ".txt", "not a valid .txt file (UnicodeDecodeError"),
    (b"PK\x03\x04", ".docx", "not a valid .docx file (BadZipFile"),
    (b"<p>six</b>", ".html", "</b> at line 1, column 7 closes no open tag"),
    (b"1\n00:00:01,000 --> nonsense\nsix\n", ".srt", "not a valid .srt file"),
])
def test_a_file_that_is_not_what_its_name_says_is_one_bad_input(data, suffix, message):
    with pytest.raises(BadInput, match=message.replace("(", r"\(").replace(".", r"\.")):
        files.read(data, suffix)


def test_a_package_without_its_text_part_is_refused():
    package = io.BytesIO()
    with zipfile.ZipFile(package, "w") as z:
        z.writestr("other.xml", "<a/>")
    with pytest.raises(BadInput, match="not a valid .pptx file|has no part"):
        files.read(package.getvalue(), ".pptx")
