"""CTranslate2 model directories and Argos Translate packages imported by twostep's own reader
(twostep/model/ct2.py, argos.py): models written by CTranslate2's converters (tests/ct2_models.py), imported,
exported once, and decoded as ctranslate2.Translator(compute_type="float32") decodes them; and one line, exit 1,
nothing written, for each bad input."""

from __future__ import annotations

import json
import shutil
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

import hf_models
from cli_helpers import assert_user_error, leftovers, twostep

pytest.importorskip("ctranslate2", reason="CTranslate2 is the reference of these tests")

SENTENCES = hf_models.TEST_SENTENCES + ["the dog sat in the garden", "a dog ran over the mat", "good dog"]
MAX_LEN = 24
SCORE_ATOL = 1e-4  # |twostep's score - CTranslate2's|: fp32 logits agree to ~1e-5 a step


@dataclass(frozen=True)
class Imported:
    ct2: Path  # the CTranslate2 directory
    art: Path  # twostep's artifact of it
    spm: Path  # the SentencePiece model that splits its source text
    vocab: list[str]  # CTranslate2's target vocabulary
    prefix: tuple[str, ...] = ()  # source pieces before a sentence's (Marian's >>fra<<)
    suffix: tuple[str, ...] = ()  # and after (Marian's </s>)


def import_and_export(src: Path, root: Path, **options) -> Path:
    from twostep.exporter.export import export
    from twostep.model.sources import import_model

    import_model(src, root / "ckpt", **options)
    export(root / "ckpt", root / "art")
    return root / "art"


def with_spm(ct2: Path, spm: Path, out: Path) -> Path:
    """A copy of a CTranslate2 directory with its SentencePiece model beside the model, where the import finds it."""
    shutil.copytree(ct2, out)
    shutil.copy(spm, out / "sentencepiece.model")
    return out


def target_vocab(ct2: Path) -> list[str]:
    return json.loads((ct2 / "shared_vocabulary.json").read_text())


@pytest.fixture(scope="session")
def imported(ct2_models, tmp_path_factory) -> dict[str, Imported]:
    """Each CTranslate2 model imported and exported once: the OpenNMT-py conversion in float32 and int8 (pre-norm,
    stored sinusoids, tied embeddings and generator), the transformers Marian conversion (post-norm, swish,
    projection bias, start_from_zero_embedding)."""
    root = tmp_path_factory.mktemp("ct2-imported")
    out = {}
    for name, ct2 in (("float32", ct2_models.ct2), ("int8", ct2_models.ct2_int8)):
        ct2 = with_spm(ct2, ct2_models.spm, root / name / "ct2")
        out[name] = Imported(ct2, import_and_export(ct2, root / name), ct2_models.spm, target_vocab(ct2))
    out["marian"] = Imported(ct2_models.marian, import_and_export(ct2_models.marian, root / "marian"),
                             ct2_models.marian / "source.spm", target_vocab(ct2_models.marian), (">>fra<<",),
                             ("</s>",))
    return out


def ours(model: Imported, options, sentences=SENTENCES):
    """twostep's hypotheses for the sentences' CTranslate2 source pieces (ids through its vocabulary)."""
    import sentencepiece as spm

    from twostep.runtime.translator import open_translator

    sp = spm.SentencePieceProcessor(model_file=str(model.spm))
    index = {t: i for i, t in reversed(list(enumerate(target_vocab(model.ct2))))}
    sources = [[index.get(p, index["<unk>"]) for p in (*model.prefix, *sp.encode(s, out_type=str), *model.suffix)]
               for s in sentences]
    translator, backend = open_translator(model.art)
    with backend:
        return translator.decode_ids(sources, options)


def reference(model: Imported, **kwargs):
    import ct2_models

    return ct2_models.ct2_reference(model.ct2, model.spm, SENTENCES, model.prefix, model.suffix,
                                    max_decoding_length=MAX_LEN, **kwargs)


@pytest.mark.parametrize("name", ["float32", "int8", "marian"])
def test_greedy_equals_ctranslate2(imported, name):
    from twostep.runtime.decoding import DecodeOptions

    model = imported[name]
    expected, _ = reference(model, beam_size=1, min_decoding_length=0)
    got = ours(model, DecodeOptions(max_new_tokens=MAX_LEN))
    assert [[model.vocab[i] for i in h[0].tokens] for h in got] == expected
    assert len({tuple(e) for e in expected}) >= 4  # the outputs vary with the input


@pytest.mark.parametrize("name", ["float32", "int8", "marian"])
def test_argostranslates_beam_search_equals_ctranslate2(imported, name):
    """Beam 4, length_penalty 0.2, EOS blocked at the first step (CTranslate2's min_decoding_length 1): the
    settings argostranslate decodes with, under CTranslate2's beam rule; tokens to the last, scores alike."""
    from twostep.runtime.decoding import DecodeOptions

    model = imported[name]
    expected, scores = reference(model, beam_size=4, length_penalty=0.2)
    got = ours(model, DecodeOptions(beam_size=4, length_penalty=0.2, beam_stop="ctranslate2", max_new_tokens=MAX_LEN,
                                    min_new_tokens=1))
    assert [[model.vocab[i] for i in h[0].tokens] for h in got] == expected
    assert np.allclose([h[0].score for h in got], scores, atol=SCORE_ATOL)


def pieces_of(model: Imported, hypothesis) -> list[str]:
    """A hypothesis as CTranslate2 gives it: its target pieces, each <unk> replaced where replace_unknowns did."""
    replaced = dict(hypothesis.replacements)
    return [replaced.get(k, model.vocab[i]) for k, i in enumerate(hypothesis.tokens)]


@pytest.mark.parametrize("name", ["float32", "int8"])
@pytest.mark.parametrize("beam", [1, 4])
def test_replace_unknowns_equals_ctranslate2(imported, name, beam):
    """Each <unk> replaced by the source piece the alignment head weighs most (the model is trained to say <unk>
    for "chien": the sentences with "dog" exercise it), greedy and with argostranslate's beam search."""
    from twostep.runtime.decoding import DecodeOptions

    model = imported[name]
    kwargs = dict(beam_size=beam, length_penalty=0.2) if beam > 1 else dict(beam_size=1)
    expected, _ = reference(model, replace_unknowns=True, **kwargs)
    plain, _ = reference(model, **kwargs)
    assert expected != plain  # some <unk> was replaced
    got = ours(model, DecodeOptions(max_new_tokens=MAX_LEN, min_new_tokens=1, replace_unknowns=True,
                                    beam_stop="ctranslate2", **kwargs))
    assert [pieces_of(model, h[0]) for h in got] == expected


def test_argos_package_translates_as_argostranslate_with_no_flags(ct2_models, argos_artifact):
    """`twostep translate ART` on an imported Argos package, no decoding flags: argostranslate's text (its beam
    search, replace_unknowns, detokenization) for every sentence, and scores alike."""
    import ct2_models as build
    from twostep.runtime.translator import open_translator

    art = argos_artifact
    expected = build.argos_reference(ct2_models.argos_dir, SENTENCES)
    translator, backend = open_translator(art)
    with backend:
        got = translator.translate_nbest(SENTENCES, split=False)
    assert [text for text, _ in expected] == [hyps[0][0] for hyps in got]
    assert np.allclose([score for _, score in expected], [hyps[0][1] for hyps in got], atol=SCORE_ATOL)
    unreplaced, _ = build.ct2_reference(ct2_models.argos_dir / "model", ct2_models.spm, SENTENCES, beam_size=4,
                                        length_penalty=0.2)
    assert any("<unk>" in pieces for pieces in unreplaced)  # a replaced <unk> is among the texts compared
    cli = twostep("translate", art, "--no-split", *SENTENCES[:3])
    assert cli.returncode == 0, cli.stderr
    assert cli.stdout.splitlines() == [text for text, _ in expected[:3]]


def test_the_import_reads_what_each_converter_wrote(imported):
    from twostep.artifact import load_artifact

    pre = load_artifact(imported["float32"].art).config
    post = load_artifact(imported["marian"].art).config
    assert (pre.norm_placement, pre.positions, pre.tie_generator, pre.activation) == ("pre", "learned", True, "relu")
    assert pre.encoder_final_norm and pre.decoder_final_norm and not pre.zero_start_embedding
    assert pre.norm_eps == 1e-5  # config.json's layer_norm_epsilon null: CTranslate2's LayerNorm default
    assert (post.norm_placement, post.activation, post.zero_start_embedding) == ("post", "silu", True)
    assert not post.encoder_final_norm


def test_int8_weights_are_dequantized_as_ctranslate2_does(ct2_models):
    """int8 rows divided by their weight_scale: within half a quantization step of the float32 weights."""
    from twostep.model.ct2 import CT2Model

    fp32, int8 = CT2Model.read(ct2_models.ct2), CT2Model.read(ct2_models.ct2_int8)
    name = "encoder/layer_0/ffn/linear_0/weight"
    assert int8.variables[name].dtype == np.int8 and fp32.variables[name].dtype == np.float32
    exact, dequantized = fp32.weight(name).numpy(), int8.weight(name).numpy()
    step = np.abs(exact).max(axis=1, keepdims=True) / 127
    assert np.all(np.abs(dequantized - exact) <= step / 2 + 1e-7)
    assert not np.array_equal(dequantized, exact)


def test_an_argos_package_imports_with_its_languages(ct2_models, tmp_path):
    """The .argosmodel zip and the folder argostranslate installs import alike, read in place: the languages of
    metadata.json, the decoding defaults of argostranslate, its detokenization; nothing extracted."""
    from twostep.model.checkpoint import load_checkpoint
    from twostep.model.sources import import_model

    before = sorted(p.name for p in ct2_models.argos.parent.iterdir())
    for src, out in ((ct2_models.argos, tmp_path / "zip"), (ct2_models.argos_dir, tmp_path / "folder")):
        ckpt = import_model(src, out)
        tokenizer = ckpt.info["tokenizer"]
        assert ckpt.info["imported_from"]["format"] == "argos"
        assert set(tokenizer["languages"]["source"]) == {"en"} and set(tokenizer["languages"]["target"]) == {"fr"}
        assert tokenizer["detokenize"] == "argos"
        assert ckpt.info["decoding"] == {"beam_size": 4, "length_penalty": 0.2, "beam_stop": "ctranslate2",
                                         "max_new_tokens": 256, "min_new_tokens": 1, "replace_unknowns": True}
    assert sorted(p.name for p in ct2_models.argos.parent.iterdir()) == before
    a, b = load_checkpoint(tmp_path / "zip"), load_checkpoint(tmp_path / "folder")
    assert all(np.array_equal(x, y) for x, y in zip(a.model.state_dict().values(), b.model.state_dict().values()))


def test_argos_own_codes_import_as_the_tags_libretranslate_shows(ct2_models, tmp_path):
    """Argos's zt, pb and zh (LibreTranslate's codes) are recorded as zh-Hant, pt-BR and zh-Hans, so a server lists
    them as LibreTranslate does and its zt and pb reach them; the package's own codes stay in its source."""
    import ct2_models as build
    from twostep.model.checkpoint import read_tokenizer
    from twostep.model.sources import import_model
    from twostep.serving.api.libretranslate import routed
    from twostep.serving.models import Catalog, Model

    for source, target, tags in (("zt", "pb", ("zh-Hant", "pt-BR")), ("en", "zh", ("en", "zh-Hans"))):
        package = build.argos_package(ct2_models.ct2_int8, ct2_models.spm, tmp_path / source, source, target)
        ckpt = import_model(package, tmp_path / f"{source}-ckpt")
        languages = ckpt.info["tokenizer"]["languages"]
        assert (list(languages["source"]), list(languages["target"])) == ([tags[0]], [tags[1]])
        assert (ckpt.info["imported_from"]["from_code"], ckpt.info["imported_from"]["to_code"]) == (source, target)
        catalog = Catalog.of([Model("p", tmp_path, read_tokenizer(tmp_path / f"{source}-ckpt").languages)])
        assert sorted(catalog.languages()) == sorted(tags)
        route = routed(catalog, source, target)  # as a LibreTranslate client names them
        assert (route.source, route.target) == tags


def test_src_lang_and_tgt_lang_name_a_ct2_models_pair_and_rename_an_argos_packages(ct2_models, tmp_path):
    """A CTranslate2 directory names no languages: `twostep import --src-lang --tgt-lang` names its pair, in the
    Argos shape (no token, the defaults); an Argos package's named pair may be renamed (its files' pt for pt-BR)."""
    from twostep.model.checkpoint import read_tokenizer

    model = with_spm(ct2_models.ct2, ct2_models.spm, tmp_path / "model")
    assert twostep("import", model, "--out", tmp_path / "bare").returncode == 0
    assert read_tokenizer(tmp_path / "bare").languages.to_json()["source"] == {}
    for src, langs, want in ((model, ("en", "de"), ("en", "de")), (ct2_models.argos, ("en", "fr-CA"), ("en", "fr-CA")),
                             (ct2_models.argos, ("de", None), ("de", "fr"))):
        out = tmp_path / f"{src.name}-{langs[0]}"
        result = twostep("import", src, "--out", out, "--src-lang", langs[0],
                         *(["--tgt-lang", langs[1]] if langs[1] else []))
        assert result.returncode == 0, result.stderr
        languages = read_tokenizer(out).languages.to_json()
        assert (languages["source"], languages["target"]) == ({want[0]: []}, {want[1]: {"source": [], "decoder": []}})
        assert (languages["default_source"], languages["default_target"]) == want


# --- bad inputs: one line, exit 1, nothing written ---


def bad_import(src: Path, tmp_path: Path, expected: str) -> None:
    out = tmp_path / "out"
    result = twostep("import", src, "--out", out)
    assert_user_error(result, expected)
    assert len([line for line in result.stderr.splitlines() if line.strip()]) == 1, result.stderr
    assert not out.exists() and not leftovers(tmp_path)


def test_a_truncated_model_bin_is_refused(ct2_models, tmp_path):
    model = with_spm(ct2_models.ct2, ct2_models.spm, tmp_path / "model")
    data = (model / "model.bin").read_bytes()
    (model / "model.bin").write_bytes(data[: len(data) // 2])
    # the bounds check's own words ("truncated" alone is in the temporary folder's name)
    bad_import(model, tmp_path, f"truncated ({len(data) // 2} bytes; a field at byte")


def test_an_unknown_binary_version_is_refused(ct2_models, tmp_path):
    model = with_spm(ct2_models.ct2, ct2_models.spm, tmp_path / "model")
    data = (model / "model.bin").read_bytes()
    (model / "model.bin").write_bytes(struct.pack("<I", 7) + data[4:])
    bad_import(model, tmp_path, "binary version 7")


def rename_variable(model_bin: Path, old: str, new: str) -> None:
    """A variable renamed in model.bin (its length-prefixed name), as if it were another spec feature's."""
    def field(name: str) -> bytes:
        return struct.pack("<H", len(name) + 1) + name.encode() + b"\0"

    data = model_bin.read_bytes()
    assert data.count(field(old)) == 1
    model_bin.write_bytes(data.replace(field(old), field(new)))


def test_a_spec_feature_twostep_does_not_run_is_named(ct2_models, tmp_path):
    model = with_spm(ct2_models.ct2, ct2_models.spm, tmp_path / "model")
    # the encoder's first self-attention gains Shaw-style relative positions
    rename_variable(model / "model.bin", "encoder/layer_0/self_attention/linear_1/weight",
                    "encoder/layer_0/self_attention/relative_position_keys")
    bad_import(model, tmp_path, "Shaw-style relative positions")


def test_a_vocabulary_that_does_not_fit_the_embedding_is_refused(ct2_models, tmp_path):
    model = with_spm(ct2_models.ct2, ct2_models.spm, tmp_path / "model")
    vocab = json.loads((model / "shared_vocabulary.json").read_text())
    (model / "shared_vocabulary.json").write_text(json.dumps(vocab + ["extra"]))
    bad_import(model, tmp_path, "vocabulary has")


def test_a_zip_member_escaping_the_package_is_refused(ct2_models, tmp_path):
    package = tmp_path / "evil.argosmodel"
    shutil.copy(ct2_models.argos, package)
    with zipfile.ZipFile(package, "a") as archive:
        archive.writestr("../escaped.txt", "outside")
    bad_import(package, tmp_path, "escapes the package")
    assert not (tmp_path.parent / "escaped.txt").exists()


def test_a_package_without_from_code_is_refused(ct2_models, tmp_path):
    package = tmp_path / "package"
    shutil.copytree(ct2_models.argos_dir, package)
    metadata = json.loads((package / "metadata.json").read_text())
    del metadata["from_code"]
    (package / "metadata.json").write_text(json.dumps(metadata))
    bad_import(package, tmp_path, "no from_code")


def test_a_corrupt_package_file_is_refused(tmp_path):
    package = tmp_path / "translate-en_fr-1_0.argosmodel"
    package.write_bytes(b"PK\x03\x04 not really a zip")
    bad_import(package, tmp_path, "not a readable zip file")
