"""The CTranslate2 and Argos Translate fixtures (tests/ct2_models.py, conftest's ct2_models): each built by
CTranslate2's own converter and loaded by ctranslate2.Translator, with outputs that vary, end, and exercise
replace_unknowns; the OpenNMT-py checkpoint is the model CTranslate2 runs, the Marian conversion decodes as
transformers does, and the Argos package is laid out as argostranslate installs it."""

from __future__ import annotations

import json
import zipfile

import pytest
import sentencepiece as spm

import hf_models
from ct2_models import SPECIALS, argos_reference, ct2_reference, opennmt_py_greedy, vocabulary

pytest.importorskip("ctranslate2")

SENTENCES = hf_models.TEST_SENTENCES
MAX_LENGTH = 40  # under Marian's 64 positions: CTranslate2 refuses to decode past them
MARIAN_SOURCE = dict(source_prefix=(">>fra<<",), source_suffix=("</s>",))  # MarianTokenizer's pieces


def sources(built) -> dict:
    """name: (CTranslate2 directory, source SentencePiece model, ct2_reference's source options)."""
    return {"opennmt_py": (built.ct2, built.spm, {}), "opennmt_py-int8": (built.ct2_int8, built.spm, {}),
            "marian": (built.marian, built.marian / "source.spm", MARIAN_SOURCE),
            "argos": (built.argos_dir / "model", built.argos_dir / "sentencepiece.model", {})}


def test_each_builds_in_seconds(ct2_models):
    print("build seconds:", ct2_models.build_s)
    assert all(seconds < 20 for seconds in ct2_models.build_s.values()), ct2_models.build_s


@pytest.mark.parametrize("name", ["opennmt_py", "opennmt_py-int8", "marian", "argos"])
def test_outputs_vary_and_end(ct2_models, name):
    ct2_dir, spm_file, source = sources(ct2_models)[name]
    tokens, scores = ct2_reference(ct2_dir, spm_file, SENTENCES, beam_size=1, max_decoding_length=MAX_LENGTH,
                                   **source)
    assert len({tuple(t) for t in tokens}) >= len(SENTENCES) // 2, tokens
    assert sum(len(t) < 20 for t in tokens) > len(SENTENCES) // 2, tokens
    assert all(score < 0 for score in scores)


@pytest.mark.parametrize("name", ["opennmt_py", "opennmt_py-int8", "argos"])
@pytest.mark.parametrize("beam_size", [1, 4])
def test_unknowns_come_out_and_are_replaced_by_source_pieces(ct2_models, name, beam_size):
    """"chien" was taught as <unk>: some sentence's output holds <unk>, and replace_unknowns puts a piece of that
    sentence's source (the one attended most) in its place, the rest unchanged."""
    ct2_dir, spm_file, _ = sources(ct2_models)[name]
    options = dict(beam_size=beam_size, max_decoding_length=MAX_LENGTH)
    plain, _ = ct2_reference(ct2_dir, spm_file, SENTENCES, **options)
    replaced, _ = ct2_reference(ct2_dir, spm_file, SENTENCES, replace_unknowns=True, **options)
    sp = spm.SentencePieceProcessor(model_file=str(spm_file))
    with_unk = [i for i, pieces in enumerate(plain) if "<unk>" in pieces]
    assert with_unk, plain
    for i in with_unk:
        assert len(replaced[i]) == len(plain[i])
        swapped = [r for p, r in zip(plain[i], replaced[i]) if p == "<unk>"]
        assert set(swapped) <= set(sp.encode(SENTENCES[i], out_type=str)), swapped
        assert [r for p, r in zip(plain[i], replaced[i]) if p != "<unk>"] == [p for p in plain[i] if p != "<unk>"]


def test_the_checkpoint_is_the_model_ctranslate2_runs(ct2_models):
    """The module that trained the checkpoint and CTranslate2's conversion of it decode the same pieces
    (CTranslate2 with min_decoding_length 0: its default, 1, forbids the empty output the module may give)."""
    theirs, _ = ct2_reference(ct2_models.ct2, ct2_models.spm, SENTENCES, beam_size=1, min_decoding_length=0,
                              max_decoding_length=MAX_LENGTH)
    assert opennmt_py_greedy(ct2_models.opennmt_py, ct2_models.spm, SENTENCES, MAX_LENGTH) == theirs


def test_opennmt_py_conversion_layout(ct2_models):
    """One shared_vocabulary.json beginning with OpenNMT-py's specials; config.json with CTranslate2's tokens;
    int8 weights in a smaller model.bin."""
    for ct2_dir in (ct2_models.ct2, ct2_models.ct2_int8):
        assert sorted(p.name for p in ct2_dir.iterdir()) == ["config.json", "model.bin", "shared_vocabulary.json"]
        assert json.loads((ct2_dir / "config.json").read_text()) == {
            "add_source_bos": False, "add_source_eos": False, "bos_token": "<s>", "decoder_start_token": "<s>",
            "eos_token": "</s>", "layer_norm_epsilon": None, "multi_query_attention": False, "unk_token": "<unk>"}
        vocab = json.loads((ct2_dir / "shared_vocabulary.json").read_text())
        assert vocab[:4] == SPECIALS and vocab == vocabulary(ct2_models.spm)
    assert (ct2_models.ct2_int8 / "model.bin").stat().st_size < (ct2_models.ct2 / "model.bin").stat().st_size


def test_marian_conversion_decodes_as_transformers(ct2_models):
    """Greedy pieces of CTranslate2's Marian and transformers' generate() on its source directory agree (the
    target vocabulary is the shared one, <pad> dropped from its end)."""
    ct2_dir = ct2_models.marian
    assert {"source.spm", "target.spm", "shared_vocabulary.json"} <= {p.name for p in ct2_dir.iterdir()}
    config = json.loads((ct2_dir / "config.json").read_text())
    assert (config["decoder_start_token"], config["eos_token"]) == ("</s>", "</s>")
    vocab = json.loads((ct2_dir / "shared_vocabulary.json").read_text())
    theirs, _ = ct2_reference(ct2_dir, ct2_dir / "source.spm", SENTENCES, beam_size=1, min_decoding_length=0,
                              max_decoding_length=20, **MARIAN_SOURCE)
    ids = hf_models.reference(ct2_models.marian_hf, SENTENCES, 20, tgt_lang="fra")[0]
    assert [[vocab[i] for i in row] for row in ids] == theirs


def test_argos_package_is_one_folder_as_argostranslate_reads_it(ct2_models):
    with zipfile.ZipFile(ct2_models.argos) as archive:
        names = archive.namelist()
    top = {name.split("/")[0] for name in names}
    assert top == {"translate-en_fr-1_0"} and ct2_models.argos.name == "translate-en_fr-1_0.argosmodel"
    folder = ct2_models.argos_dir
    for name in ("model/model.bin", "model/config.json", "model/shared_vocabulary.json", "sentencepiece.model",
                 "metadata.json", "README.md"):
        assert (folder / name).is_file(), name
    assert (folder / "stanza").is_dir()
    metadata = json.loads((folder / "metadata.json").read_text())
    assert {k: metadata[k] for k in ("from_code", "to_code", "from_name", "to_name")} == {
        "from_code": "en", "to_code": "fr", "from_name": "English", "to_name": "French"}
    assert {"package_version", "argos_version"} <= set(metadata)


def test_argos_reference_is_ctranslate2_with_argostranslate_settings(ct2_models):
    """Text from argostranslate's settings (beam 4, length_penalty 0.2, replace_unknowns) and its detokenization:
    no <unk> left, no leading space, and the pieces of ct2_reference with the same settings."""
    answers = argos_reference(ct2_models.argos_dir, SENTENCES)
    folder = ct2_models.argos_dir
    pieces, scores = ct2_reference(folder / "model", folder / "sentencepiece.model", SENTENCES, beam_size=4,
                                   length_penalty=0.2, replace_unknowns=True)
    sp = spm.SentencePieceProcessor(model_file=str(folder / "sentencepiece.model"))
    assert [text for text, _ in answers] == [sp.decode_pieces(p).replace("▁", " ").lstrip(" ") for p in pieces]
    assert [score for _, score in answers] == pytest.approx(scores)
    assert all("<unk>" not in text and not text.startswith(" ") for text, _ in answers)
    assert len({text for text, _ in answers}) > 1
