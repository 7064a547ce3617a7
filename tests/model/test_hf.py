"""Importing transformers model directories (twostep/model/hf/): the tokenization each family does, as
transformers' own tokenizer does it, and one clear line for what cannot be imported, with nothing written."""

from __future__ import annotations

import json
import shutil

import pytest

import hf_models
from cli_helpers import assert_user_error, leftovers, twostep
from conftest import ONLY_MBART50
from twostep.runtime.tokenizer import Tokenizer

TRICKY = ["the cat sat on the mat", "  leading and trailing spaces  ", "zebra xylophone qqq", "unicode: café ñ 猫",
          "</s> in the middle", "the <unk> token", "a  double  space", "punctuation, dots... and !?", "x",
          "accents: àéîõü Ünïcödé naïve", "digits 0123456789 and 3.14 or 1,000", "fra_Latn typed in the text",
          "de_DE typed in the text", "__de__ typed in the text", "the <mask> token", "tab\tand\nnewline"]


# Where twostep's ids differ from transformers 5's, by rule (docs/models.md#pretrained-families): M2M100's language
# token typed in the text is one id in twostep (as transformers 4 had it), pieces in transformers 5; NLLB's <mask>
# eats the whitespace before it in tokenizers (lstrip), not in twostep's SentencePiece path.
KNOWN_DIFFERENCES = {"m2m100": ("__de__ typed in the text",), "nllb": ("the <mask> token",)}


def test_source_ids_are_those_of_the_family_tokenizer(pretrained):
    """Source text to ids, language tokens included, exactly as transformers' tokenizer gives them. A Marian
    language token typed in the text counts where transformers looks for one, at the start; twostep also finds
    it elsewhere (transformers splits it into pieces there: docs/models.md)."""
    from transformers import AutoTokenizer

    ours = Tokenizer.load(pretrained.ckpt, load_spec(pretrained.ckpt))
    theirs = AutoTokenizer.from_pretrained(pretrained.hf)
    langs = pretrained.langs
    if pretrained.name == "marian":
        assert ours.encode_source(">>deu<< typed first") == theirs(">>deu<< typed first").input_ids
    for text in TRICKY:
        if text in KNOWN_DIFFERENCES.get(pretrained.name, ()):
            continue
        if "src_lang" in langs:
            theirs.src_lang = langs["src_lang"]
            want = theirs(text).input_ids
        elif "tgt_lang" in langs:
            want = theirs(f">>{langs['tgt_lang']}<< {text}").input_ids
        else:
            want = theirs(text).input_ids
        assert ours.encode_source(text, **langs) == want, text


def test_target_ids_decode_to_the_family_tokenizer_text(pretrained):
    """Generated ids back to text as transformers decodes them (special ids dropped). Left out of the draw: M2M100's
    language tokens, which transformers 5 keeps in the text and twostep drops like every special id (as
    transformers 4 did), and its 8 "madeup word" ids, which have no piece (transformers 5 writes "<unk>" for
    them, twostep nothing)."""
    import numpy as np
    from transformers import AutoTokenizer

    ours = Tokenizer.load(pretrained.ckpt, load_spec(pretrained.ckpt))
    theirs = AutoTokenizer.from_pretrained(pretrained.hf)
    vocab = json.loads((pretrained.ckpt / "config.json").read_text())["model"]["tgt_vocab_size"]
    languages = set(ours.spec.languages.source.values()) | {t.decoder for t in ours.spec.languages.target.values()}
    language_ids = {i for ids in languages for i in ids}
    pieces = ours.target_pieces if hasattr(ours, "target_pieces") else {i for i in range(ours.vocab_size)}
    drawable = [i for i in range(vocab) if i in pieces and i not in language_ids]
    rng = np.random.default_rng(0)
    for _ in range(50):
        ids = [int(i) for i in rng.choice(drawable, rng.integers(1, 12))]
        # twostep strips the text's surrounding whitespace; NLLB's and mBART's tokenizers keep a "▁" piece at
        # either end as a space
        assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True).strip(), ids


def load_spec(ckpt):
    from twostep.model.checkpoint import read_tokenizer

    return read_tokenizer(ckpt)


@pytest.fixture(scope="module")
def marian_hf(tmp_path_factory):
    pytest.importorskip("transformers")
    return hf_models.marian_dir(tmp_path_factory.mktemp("marian-bad") / "hf", train_steps=0)


def broken_copy(src, tmp_path, edit):
    """A copy of a transformers directory with one thing broken by `edit(dir)`."""
    bad = tmp_path / "bad"
    shutil.copytree(src, bad)
    edit(bad)
    return bad


def edit_config(**changes):
    def edit(path):
        config = json.loads((path / "config.json").read_text())
        config.update(changes)
        (path / "config.json").write_text(json.dumps(config))
    return edit


@pytest.mark.parametrize("edit, fragments", [
    (edit_config(model_type="bert"), ["model_type 'bert' is not a family twostep imports", "m2m_100,", "marian,",
                                      "mbart,", "nllb"]),
    (lambda p: (p / "source.spm").unlink(), ["missing source.spm"]),
    (lambda p: (p / "vocab.json").write_text(json.dumps({"<unk>": 0, "</s>": 1, "a": 2})),
     ["vocab.json has 3 entries", "rows"]),
    (edit_config(encoder_attention_heads=2), ["attention heads differ"]),
    (edit_config(activation_function="mish"), ["activation_function 'mish'"]),
    (lambda p: (p / "model.safetensors").write_bytes(b"not safetensors"), ["cannot read safetensors"]),
])
def test_what_cannot_be_imported_is_one_line_and_nothing_is_written(marian_hf, tmp_path, edit, fragments):
    bad = broken_copy(marian_hf, tmp_path, edit)
    out = tmp_path / "ckpt"
    assert_user_error(twostep("import", bad, "--out", out), *fragments)
    assert not out.exists()
    assert leftovers(tmp_path) == []


@pytest.fixture(scope="module")
def nllb_hf(tmp_path_factory):
    pytest.importorskip("transformers")
    return hf_models.nllb_dir(tmp_path_factory.mktemp("nllb-bad") / "hf", train_steps=0)


@pytest.fixture(scope="module")
def mbart_hf(tmp_path_factory):
    pytest.importorskip("transformers")
    return hf_models.mbart50_dir(tmp_path_factory.mktemp("mbart-bad") / "hf", train_steps=0)


def wordpiece(path):
    """A tokenizer.json of a kind twostep does not read (BERT's WordPiece), written by the tokenizers library."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers.models import WordPiece

    HFTokenizer(WordPiece({"[UNK]": 0, "the": 1}, unk_token="[UNK]")).save(str(path / "tokenizer.json"))


def shorter_positions(path):
    """An mBART checkpoint whose decoder position table has max_position_embeddings + 1 rows, not + 2."""
    from safetensors.torch import load_file, save_file

    weights = load_file(path / "model.safetensors")
    key = next(k for k in weights if k.endswith("decoder.embed_positions.weight"))
    weights[key] = weights[key][:-1].contiguous()
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})


def remove_tokenizer(path):
    for name in ("tokenizer.json", "sentencepiece.bpe.model", "tokenizer_config.json"):
        (path / name).unlink(missing_ok=True)


def without_json(path, edit):
    """The hub's mBART-50 layout (no tokenizer.json), then `edit(path)`."""
    (path / "tokenizer.json").unlink()
    edit(path)


def another_spm(path):
    """A SentencePiece model of fewer pieces than the weights' embedding numbers."""
    hf_models.train_spm(path / "sentencepiece.bpe.model", hf_models.SOURCE_TEXT, 40, model_type="unigram")


def extra_special(path):
    """A special token beyond MBart50Tokenizer's own, whose id only tokenizer.json would give."""
    (path / "special_tokens_map.json").write_text(json.dumps({"additional_special_tokens": ["en_XX", "<extra>"]}))


@pytest.mark.parametrize("family, edit, fragments", [
    ("nllb", remove_tokenizer, ["no tokenizer files", "NLLB"]),
    ("nllb", lambda p: (p / "tokenizer.json").unlink(), ["missing tokenizer.json", "NLLB"]),
    ("nllb", wordpiece, ["a WordPiece tokenizer", "BPE and Unigram"]),
    ("mbart", shorter_positions, ["decoder.embed_positions.weight has 65 rows", "needs 66"]),
    ("mbart", remove_tokenizer, ["neither tokenizer.json nor sentencepiece.bpe.model", "mBART-50"]),
    ("mbart", lambda p: without_json(p, another_spm),
     ["sentencepiece.bpe.model with mBART-50's special tokens and language codes has", "embedding has 132 rows"]),
    ("mbart", lambda p: without_json(p, extra_special), ["special tokens <extra>", "tokenizer.json"]),
])
def test_what_multilingual_families_cannot_import_is_one_line_and_nothing_is_written(request, tmp_path, family, edit,
                                                                                     fragments):
    bad = broken_copy(request.getfixturevalue(f"{family}_hf"), tmp_path, edit)
    out = tmp_path / "ckpt"
    assert_user_error(twostep("import", bad, "--out", out), *fragments)
    assert not out.exists()
    assert leftovers(tmp_path) == []


@ONLY_MBART50
def test_mbart50_without_tokenizer_json_numbers_pieces_as_MBart50Tokenizer(mbart50_hub):
    """The hub's mBART-50 layout (sentencepiece.bpe.model, tokenizer_config.json, special_tokens_map.json): every id
    as transformers' MBart50Tokenizer gives it reading the same directory (fairseq's <s> <pad> </s> <unk>, each
    piece at its SentencePiece id + 1, the 52 language codes after the pieces, <mask> last), and source text to
    ids as it tokenizes it."""
    from transformers import MBart50Tokenizer

    hub = mbart50_hub
    assert sorted(p.name for p in hub.hf.iterdir() if "token" in p.name or p.suffix == ".model") == [
        "sentencepiece.bpe.model", "special_tokens_map.json", "tokenizer_config.json"]
    theirs = MBart50Tokenizer.from_pretrained(hub.hf)
    table = json.loads((hub.ckpt / "source_vocab.json").read_text())
    assert table == theirs.get_vocab()
    assert [table[p] for p in ("<s>", "<pad>", "</s>", "<unk>", "ar_AR", "sl_SI", "<mask>")] == [
        0, 1, 2, 3, len(table) - 53, len(table) - 2, len(table) - 1]
    ours = Tokenizer.load(hub.ckpt, load_spec(hub.ckpt))
    for src_lang in ("en_XX", "de_DE"):
        theirs.src_lang = src_lang
        for text in TRICKY:
            assert ours.encode_source(text, src_lang=src_lang, tgt_lang="fr_XX") == theirs(text).input_ids, text


def test_mbart50_without_tokenizer_json_takes_its_default_languages_from_the_tokenizer_and_generation_configs(
        mbart_hf, tmp_path):
    def edit(path):
        (path / "tokenizer.json").unlink()
        config = json.loads((path / "tokenizer_config.json").read_text())
        (path / "tokenizer_config.json").write_text(json.dumps({**config, "src_lang": "de_DE"}))
        generation = json.loads((path / "generation_config.json").read_text())
        ro = json.loads((mbart_hf / "tokenizer.json").read_text())["model"]["vocab"]
        ro_id = next(i for i, (piece, _) in enumerate(ro) if piece == "ro_RO")
        (path / "generation_config.json").write_text(json.dumps({**generation, "forced_bos_token_id": ro_id}))

    hub = broken_copy(mbart_hf, tmp_path, edit)
    result = twostep("import", hub, "--out", tmp_path / "ckpt")
    assert result.returncode == 0, result.stderr
    languages = load_spec(tmp_path / "ckpt").languages
    assert (languages.default_source, languages.default_target) == ("de_DE", "ro_RO")


def test_nllb_is_found_under_m2m100s_model_type_and_format_names_it(nllb_hf, tmp_path):
    result = twostep("import", nllb_hf, "--out", tmp_path / "found")
    assert result.returncode == 0, result.stderr
    assert "nllb" in result.stdout
    config = json.loads((tmp_path / "found" / "config.json").read_text())
    assert config["imported_from"]["format"] == "nllb"
    result = twostep("import", nllb_hf, "--out", tmp_path / "named", "--format", "nllb")
    assert result.returncode == 0, result.stderr


def test_format_overrides_model_type(marian_hf, tmp_path):
    bad = broken_copy(marian_hf, tmp_path, edit_config(model_type="marian-fork"))
    result = twostep("import", bad, "--out", tmp_path / "ckpt", "--format", "marian")
    assert result.returncode == 0, result.stderr
    assert "marian" in result.stdout


def test_an_unknown_language_lists_the_valid_ones(pretrained, tmp_path):
    result = twostep("translate", pretrained.art, "hello", "--tgt-lang", "xx", *(
        ["--src-lang", pretrained.langs["src_lang"]] if "src_lang" in pretrained.langs else []))
    codes = sorted(load_spec(pretrained.ckpt).languages.target)
    if pretrained.other_target:
        assert_user_error(result, "unknown target language 'xx'", ", ".join(codes[:3]))
    elif pretrained.name == "marian":
        assert_user_error(result, "unknown target language 'xx': this model has deu, fra")
    else:
        assert_user_error(result, "unknown target language 'xx': this model has no target languages")


def test_the_imported_config_never_generates_what_generation_config_bans(pretrained):
    """generation_config.json's one-token bad_words_ids (OPUS-MT's pad) become never_generate: without them a
    Marian model may generate pad, where transformers never does."""
    generation = json.loads((pretrained.hf / "generation_config.json").read_text())
    banned = sorted({ids[0] for ids in generation.get("bad_words_ids") or [] if len(ids) == 1})
    config = json.loads((pretrained.ckpt / "config.json").read_text())["model"]
    assert config["never_generate"] == banned
    if pretrained.name.startswith("marian"):
        assert banned == [config["pad_id"]], "the Marian test models ban pad, as OPUS-MT's do"
