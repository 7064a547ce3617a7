"""Decoding defaults recorded in the artifact: a checkpoint info's `decoding` section goes into the manifest at
export, and every consumer (Translator, `twostep translate`, `twostep serve`'s /v1/translate and LibreTranslate's
/translate) decodes with it where the caller sets nothing; what the caller sets wins. An Argos Translate package
imported decodes this way with CTranslate2's options."""

from __future__ import annotations

import json
import shutil
from dataclasses import fields

import httpx
import pytest

from cli_helpers import assert_user_error, twostep
from serving_helpers import post, server
from twostep.artifact import load_artifact
from twostep.artifact.manifest import DECODING_FIELDS
from twostep.errors import BadArtifact, BadInput
from twostep.runtime.decoding import DecodeOptions
from twostep.runtime.decoding.options import with_defaults
from twostep.runtime.translator import open_translator
from twostep.serving.api.libretranslate import formatted

ARGOS = {"beam_size": 4, "length_penalty": 0.2, "beam_stop": "ctranslate2", "max_new_tokens": 64,
         "min_new_tokens": 1}
EXPLICIT = ["--beam", "4", "--length-penalty", "0.2", "--beam-stop", "ctranslate2", "--max-new-tokens", "64",
            "--min-new-tokens", "1"]
SENTENCES = ["Hello world.", "Where is the station?", "The cat sat on the mat."]


def with_decoding(src, dst, decoding) -> object:
    """A copy of the checkpoint `src` whose info carries `decoding`."""
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**config, "decoding": decoding}))
    return dst


SAMPLED = {**ARGOS, "beam_size": 1, "sampling": True, "seed": 7, "temperature": 2.0}


@pytest.fixture(scope="module")
def argos(tmp_path_factory, demo_model_dir):
    """(artifact, the texts of beam 1, those of ARGOS): the demo model exported with ARGOS as its defaults."""
    from twostep.exporter.export import export

    root = tmp_path_factory.mktemp("defaults")
    art = export(with_decoding(demo_model_dir, root / "ckpt", ARGOS), root / "art", variants=[]).path
    translator, backend = open_translator(art, options=DecodeOptions())
    with backend:
        greedy = translator.translate(SENTENCES)
        explicit = translator.translate(SENTENCES, DecodeOptions(**ARGOS))
    assert greedy != explicit, "the defaults should decode some sentence differently from greedy search"
    return art, greedy, explicit


def test_the_manifest_records_them_and_the_translator_decodes_with_them(argos):
    art, greedy, explicit = argos
    assert load_artifact(art).manifest.decoding == ARGOS
    translator, backend = open_translator(art)
    with backend:
        assert translator.options == DecodeOptions(**ARGOS)
        assert translator.translate(SENTENCES) == explicit
        assert translator.options_with(beam_size=1, beam_stop=None) == DecodeOptions(**{**ARGOS, "beam_size": 1})
    translator, backend = open_translator(art, options={"beam_size": 1})
    with backend:
        assert translator.translate(SENTENCES) == greedy


def test_cli_translates_with_them_unless_a_flag_says_otherwise(argos):
    art, greedy, explicit = argos
    default = twostep("translate", art, *SENTENCES)
    assert default.returncode == 0, default.stderr
    assert default.stdout.splitlines() == explicit
    flags = twostep("translate", art, *SENTENCES, *EXPLICIT)
    assert flags.stdout.splitlines() == explicit
    overridden = twostep("translate", art, *SENTENCES, "--beam", "1")
    assert overridden.stdout.splitlines() == greedy
    # sampling asked for wins over the default beam 4; asked for with a beam, it is refused
    sampled = twostep("translate", art, *SENTENCES, "--sample", "--seed", "7", "--temperature", "2")
    assert sampled.returncode == 0, sampled.stderr
    assert sampled.stdout.splitlines() == sampled_texts(art)
    assert_user_error(twostep("translate", art, *SENTENCES, "--sample", "--beam", "4"), "exclude each other")


def sampled_texts(art) -> list[str]:
    translator, backend = open_translator(art)
    with backend:
        return translator.translate(SENTENCES, DecodeOptions(**SAMPLED))


def test_server_translates_with_them_unless_a_field_says_otherwise(argos):
    art, greedy, explicit = argos
    with server(art) as (url, _):
        texts = lambda r: [h[0]["text"] for h in r.json()["translations"]]  # noqa: E731
        assert texts(post(url, {"text": SENTENCES})) == explicit
        assert texts(post(url, {"text": SENTENCES, "beam": 1})) == greedy
        assert texts(post(url, {"text": SENTENCES, "beam": None})) == explicit  # null: not set
        sampled = post(url, {"text": SENTENCES, "sampling": True, "seed": 7, "temperature": 2.0})
        assert sampled.status_code == 200 and texts(sampled) == sampled_texts(art)
        both = post(url, {"text": SENTENCES, "sampling": True, "beam": 4})
        assert both.status_code == 400 and "exclude each other" in both.json()["error"]
        lt = [httpx.post(f"{url}/translate", json={"q": s, "source": "en", "target": "de"}, timeout=60).json()
              for s in SENTENCES]
        assert [r["translatedText"] for r in lt] == [formatted(s, t) for s, t in zip(SENTENCES, explicit)]


def test_a_bad_decoding_section_is_one_line(argos, tmp_path):
    art, _, _ = argos
    bad = tmp_path / "bad"
    shutil.copytree(art, bad)
    manifest = json.loads((bad / "manifest.json").read_text())
    for decoding, fragment in [({"beam": 4}, "unknown option 'beam'"), ({"beam_size": "4"}, "beam_size is str"),
                               ([4], "'decoding' is list"), ({"beam_stop": "fairseq"}, "beam_stop must be one of"),
                               ({"no_repeat_ngram_size": "2"}, "no_repeat_ngram_size is str"),
                               ({"no_repeat_ngram_size": -1},
                                "no_repeat_ngram_size must be an integer in [0, 1048576], got -1")]:
        (bad / "manifest.json").write_text(json.dumps({**manifest, "decoding": decoding}))
        result = twostep("translate", bad, "Hello world.")
        assert_user_error(result, fragment)
        assert len([line for line in result.stderr.splitlines() if line.strip()]) == 1, result.stderr


def test_a_bad_checkpoint_section_stops_the_export_at_once(demo_model_dir, tmp_path):
    ckpt = with_decoding(demo_model_dir, tmp_path / "ckpt", {"beam_size": 0})
    assert_user_error(twostep("export", ckpt, "--out", tmp_path / "art"), "beam size must be an integer in [1, 256]")
    assert not (tmp_path / "art").exists()


def test_merge_rules():
    assert with_defaults(None) == DecodeOptions()
    assert with_defaults(ARGOS, beam_size=None, n_best=2) == DecodeOptions(**{**ARGOS, "n_best": 2})
    with pytest.raises(BadArtifact, match="here: bad decoding options: beam size"):
        with_defaults({"beam_size": 0}, "here")
    with pytest.raises(BadInput, match="beam size"):
        with_defaults(ARGOS, beam_size=0)
    assert set(DECODING_FIELDS) <= {f.name for f in fields(DecodeOptions)}  # the manifest's names are the options'


def test_a_callers_choice_of_search_wins_over_the_defaults():
    """Sampling asked for on a model whose default is a beam samples; a beam asked for on one whose default
    samples searches; only a caller who asks for both is refused."""
    assert with_defaults(ARGOS, sampling=True) == DecodeOptions(**{**ARGOS, "beam_size": 1, "sampling": True})
    assert with_defaults({**ARGOS, "n_best": 4}, sampling=True).n_best == 1
    assert with_defaults({"sampling": True, "temperature": 0.5}, beam_size=3) == \
        DecodeOptions(beam_size=3, temperature=0.5)
    assert with_defaults({"beam_size": 4, "n_best": 4}, beam_size=2).n_best == 2  # at most the beam asked for
    assert with_defaults(ARGOS, sampling=False) == DecodeOptions(**ARGOS)
    with pytest.raises(BadInput, match="sampling and beam search exclude each other"):
        with_defaults(ARGOS, sampling=True, beam_size=4)
    with pytest.raises(BadInput, match="n_best must be at most the beam size 1"):
        with_defaults(ARGOS, sampling=True, n_best=2)
