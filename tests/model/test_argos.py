"""Argos Translate packages (twostep/model/argos.py): what metadata.json and the zip's member names may hold,
beside test_ct2.py's imports and refusals of whole packages."""

from __future__ import annotations

import json
import re
import shutil
import zipfile
from pathlib import Path

import pytest

from twostep.errors import BadCheckpoint
from twostep.model.argos import import_package, open_zip, read_metadata

METADATA = {"type": "translate", "from_code": "en", "to_code": "fr"}


@pytest.mark.parametrize("member", ["/etc/evil.txt", "translate-en_fr/../../evil.txt", "C:/evil.txt",
                                    "\\evil.txt"])
def test_a_member_outside_the_package_is_refused(tmp_path, member):
    """An absolute path, a parent, a drive: whatever a careless extractor would write outside the package."""
    package = tmp_path / "p.argosmodel"
    with zipfile.ZipFile(package, "w") as archive:
        archive.writestr("translate-en_fr/metadata.json", json.dumps(METADATA))
        archive.writestr(member, "outside")
    with pytest.raises(BadCheckpoint, match=re.escape(f"the member {member!r} escapes the package")):
        open_zip(package)


def test_a_package_of_another_type_is_refused(tmp_path):
    """argostranslate's packages also hold sentence boundary detection models (type "sbd")."""
    (tmp_path / "metadata.json").write_text(json.dumps({**METADATA, "type": "sbd"}))
    with pytest.raises(BadCheckpoint, match="a 'sbd' package; twostep imports translate packages"):
        read_metadata(tmp_path)
    (tmp_path / "metadata.json").write_text(json.dumps({"from_code": "en", "to_code": "fr"}))
    assert read_metadata(tmp_path)["to_code"] == "fr"  # no type: translate, as argostranslate reads it


def test_target_prefix_is_forced_after_the_decoders_start(ct2_models, tmp_path):
    """A multilingual package's target_prefix token starts every target sentence, and is dropped from its text."""
    package = tmp_path / "package"
    shutil.copytree(ct2_models.argos_dir, package)
    vocab = json.loads((package / "model" / "shared_vocabulary.json").read_text())
    metadata = json.loads((package / "metadata.json").read_text())
    prefix = vocab[10]
    (package / "metadata.json").write_text(json.dumps({**metadata, "target_prefix": prefix}))
    spec = import_package(package).tokenizer
    assert spec.languages.target["fr"].decoder == (10,)
    assert 10 in spec.drop_ids
    (package / "metadata.json").write_text(json.dumps({**metadata, "target_prefix": ""}))  # "": none
    assert import_package(package).tokenizer.languages.target["fr"].decoder == ()


OPUS_MT_SENTENCES = ["the cat's hat is on the mat.", "a dog ran in the park, today!", "hello world?",
                     "the quick brown fox & the lazy dog.", 'good morning, "friend".', "the dog's garden, today.",
                     "zebra xylophone!", "hello & good morning"]


def test_an_opus_mt_bpe_package_translates_as_argostranslate(opus_mt_bpe, tmp_path):
    """A bpe.model package (an OPUS-MT model from before SentencePiece, through ct2-marian-converter) imports as
    the moses-bpe tokenizer and translates, with argostranslate's decoding, to argostranslate's text: Moses'
    escapes (&apos;, &amp;, &quot;) in and out, "@@" pieces joined, French spacing ("parc, aujourd'hui !")."""
    import ct2_models as build
    from twostep.model.sources import import_model
    from twostep.runtime.translator import open_translator

    package, installed = opus_mt_bpe
    expected = build.argos_reference(installed, OPUS_MT_SENTENCES)
    import_model(package, tmp_path / "ckpt")
    spec = json.loads((tmp_path / "ckpt" / "config.json").read_text())["tokenizer"]
    assert (spec["kind"], spec["moses"]) == ("moses-bpe", ["en", "fr"])
    translator, backend = open_translator(tmp_path / "ckpt")
    with backend:
        got = translator.translate_nbest(OPUS_MT_SENTENCES, split=False)
    assert [hyps[0][0] for hyps in got] == [text for text, _ in expected]
    texts = " ".join(text for text, _ in expected)
    assert "'" in texts and "&" in texts and " !" in texts  # what Moses unescapes and spaces is compared
    encode, decode = build.argos_bpe(installed)
    pieces = [encode(s) for s in OPUS_MT_SENTENCES]
    assert [[p for _, p in translator.tokenizer.tokens(s)] for s in OPUS_MT_SENTENCES] == pieces
    assert any(p.endswith("@@") for line in pieces for p in line)
    assert any(p.startswith("&apos") for line in pieces for p in line)
    french = [encode(s) for s in build.BPE_TARGET]  # the target side's pieces, joined by each
    assert [translator.tokenizer.join(p) for p in french] == [decode(p) for p in french]
    served_as_argostranslate(tmp_path / "ckpt", OPUS_MT_SENTENCES, [text for text, _ in expected])


def served_as_argostranslate(model: Path, sentences: list[str], expected: list[str]) -> None:
    """`twostep serve MODEL` answers argostranslate's text: on /v1/translate as it is, on LibreTranslate's
    /translate as LibreTranslate formats argostranslate's (its improve_translation_formatting)."""
    httpx = pytest.importorskip("httpx", reason="the serving tests need httpx (pip install -e '.[dev]')")
    pytest.importorskip("fastapi", reason="serving needs its extra (pip install -e '.[serve]')")
    from serving_helpers import post, server
    from twostep.serving.api.libretranslate import formatted

    with server(model) as (url, _):
        v1 = post(url, {"text": sentences, "split": False})
        assert v1.status_code == 200, v1.text
        assert [hyps[0]["text"] for hyps in v1.json()["translations"]] == expected
        lt = httpx.post(f"{url}/translate", json={"q": sentences, "source": "en", "target": "fr"}, timeout=60)
        assert lt.status_code == 200, lt.text
        assert lt.json()["translatedText"] == [formatted(s, t) for s, t in zip(sentences, expected)]


def test_an_opus_mt_spm_package_translates_as_argostranslate(ct2_models, tmp_path):
    """A Marian model converted by ct2-transformers-converter, its source.spm as the package's sentencepiece.model
    (argostranslate reads no source.spm/target.spm): its decoder starts from a zero embedding, it adds </s> to the
    source; argostranslate's text."""
    import ct2_models as build
    from twostep.model.sources import import_model
    from twostep.runtime.translator import open_translator

    package = build.argos_package(ct2_models.marian, ct2_models.marian / "source.spm", tmp_path / "pkg",
                                  zipped=False)
    expected = build.argos_reference(package, OPUS_MT_SENTENCES)
    import_model(package, tmp_path / "ckpt")
    translator, backend = open_translator(tmp_path / "ckpt")
    with backend:
        got = translator.translate_nbest(OPUS_MT_SENTENCES, split=False)
    assert [hyps[0][0] for hyps in got] == [text for text, _ in expected]
