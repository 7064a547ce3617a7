"""Importing transformers model directories (twostep/model/hf/): the tokenization each family does, as
transformers' own tokenizer does it, generate()'s decoding recorded as the model's decoding defaults, and one clear
line for what cannot be imported, with nothing written."""

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
        elif "tgt_lang" in langs:  # Marian's >>fra<<, MADLAD's <2fr> before the text
            token = f"<2{langs['tgt_lang']}>" if pretrained.name == "madlad" else f">>{langs['tgt_lang']}<<"
            want = theirs(f"{token} {text}").input_ids
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


def edit_generation(**changes):
    def edit(path):
        config = json.loads((path / "generation_config.json").read_text())
        config.update(changes)
        (path / "generation_config.json").write_text(json.dumps(config))
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
    # generate()'s settings that twostep does not decode: each named, all in one line, with the fix
    (edit_generation(repetition_penalty=1.2), ["generation_config.json: cannot import generate()'s decoding",
                                               "repetition_penalty 1.2 (a repetition penalty)",
                                               "remove it from generation_config.json"]),
    (edit_generation(do_sample=True, num_beam_groups=2, bad_words_ids=[[5], [6, 7]]),
     ["do_sample true (sampling", "num_beam_groups 2 (diverse", "bad_words_ids [[6, 7]] (sequences of several",
      "remove them from generation_config.json"]),
    (edit_generation(early_stopping="sometimes", num_beams=0, max_length=1),
     ['early_stopping "sometimes" (expected true, false or "never")', "num_beams 0 (expected an integer of at "
      "least 1)", "max_length 1 (expected an integer of at least 2)"]),
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
    assert "decoding defaults: beam_stop transformers, max_new_tokens 63" in result.stdout  # generate()'s
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


# --- a bilingual model's language pair ---


@pytest.fixture(scope="module")
def marian_pair(tmp_path_factory):
    """A bilingual Marian (separate vocabularies, no >>xx<< tokens) whose tokenizer_config.json names en -> de."""
    pytest.importorskip("transformers")
    return hf_models.marian_dir(tmp_path_factory.mktemp("marian-pair") / "hf", separate=True, train_steps=0,
                                pair=("en", "de"))


def edit_tokenizer_config(**changes):
    def edit(path):
        config = json.loads((path / "tokenizer_config.json").read_text())
        config.update(changes)
        (path / "tokenizer_config.json").write_text(json.dumps(config))
    return edit


def pair(source: str, target: str):
    from twostep.artifact.tokenizer import Languages, TargetLanguage

    return Languages(source={source: ()}, target={target: TargetLanguage()}, default_source=source,
                     default_target=target)


def one_line_error(result, *fragments):
    assert_user_error(result, *fragments)
    assert len([line for line in result.stderr.splitlines() if line.strip()]) == 1, result.stderr


def test_a_marian_that_names_its_pair_imports_with_it_and_translates_with_or_without_it(marian_pair, tmp_path):
    """tokenizer_config.json's source_lang/target_lang (as MarianTokenizer saves them) become the Argos shape: one
    source and one target, adding no token, the defaults; in the artifact (what /languages lists), a request
    without languages, by the model's codes, or by other standard tags (eng, de-DE) translates alike, with the
    source ids transformers' tokenizer gives."""
    from transformers import MarianTokenizer

    from twostep.exporter.export import export

    result = twostep("import", marian_pair, "--out", tmp_path / "ckpt")
    assert result.returncode == 0, result.stderr
    assert load_spec(tmp_path / "ckpt").languages == pair("en", "de")
    export(tmp_path / "ckpt", tmp_path / "art")
    languages = json.loads((tmp_path / "art" / "manifest.json").read_text())["tokenizer"]["languages"]
    assert (languages["source"], languages["target"]) == ({"en": []}, {"de": {"source": [], "decoder": []}})
    assert (languages["default_source"], languages["default_target"]) == ("en", "de")
    theirs = MarianTokenizer.from_pretrained(marian_pair)
    ours = Tokenizer.load(tmp_path / "ckpt", load_spec(tmp_path / "ckpt"))
    for text in TRICKY[:4]:
        assert ours.encode_source(text) == ours.encode_source(text, src_lang="eng", tgt_lang="de-DE") \
            == theirs(text).input_ids, text
    outputs = [twostep("translate", tmp_path / "art", "the cat sat", "--no-split", *langs) for langs in (
        [], ["--src-lang", "en", "--tgt-lang", "de"], ["--src-lang", "eng", "--tgt-lang", "de-DE"])]
    assert all(r.returncode == 0 for r in outputs), [r.stderr for r in outputs]
    assert len({r.stdout for r in outputs}) == 1
    one_line_error(twostep("translate", tmp_path / "art", "the cat", "--tgt-lang", "fr"),
                   "unknown target language 'fr': this model has de")


@pytest.mark.parametrize("edit, expected", [
    (edit_tokenizer_config(source_lang=None, target_lang=None), {}),  # as MarianTokenizer saves none
    (lambda p: (p / "tokenizer_config.json").unlink(), {}),
    (edit_tokenizer_config(source_lang="mul", target_lang="ROMANCE"), {}),  # OPUS-MT's codes of no one language
    (edit_tokenizer_config(source_lang="eng", target_lang="deu"), {"pair": ("eng", "deu")}),  # as written
])
def test_a_marian_names_only_the_pair_its_tokenizer_config_gives(marian_pair, tmp_path, edit, expected):
    """Only config fields are trusted (not a hub name's opus-mt-en-de), and only codes of one language."""
    from twostep.artifact.tokenizer import Languages
    from twostep.model.hf import import_hf_directory

    import_hf_directory(broken_copy(marian_pair, tmp_path, edit), tmp_path / "ckpt")
    assert load_spec(tmp_path / "ckpt").languages == (pair(*expected["pair"]) if expected else Languages())


@pytest.mark.parametrize("target_lang", ["mul", "deu"])
def test_a_multi_target_marian_keeps_its_target_tokens_and_gains_its_named_source(marian_hf, tmp_path, target_lang):
    """OPUS-MT's en-mul names source_lang eng and target_lang mul: the source is named, the targets stay the
    >>xx<< tokens, with no default target, whatever target_lang says."""
    from twostep.artifact.tokenizer import TargetLanguage
    from twostep.model.hf import import_hf_directory

    vocab = json.loads((marian_hf / "vocab.json").read_text())
    bare = tmp_path / "bare"
    import_hf_directory(marian_hf, bare / "ckpt")
    assert load_spec(bare / "ckpt").languages.source == {}
    named = broken_copy(marian_hf, tmp_path, edit_tokenizer_config(source_lang="eng", target_lang=target_lang))
    import_hf_directory(named, tmp_path / "ckpt")
    languages = load_spec(tmp_path / "ckpt").languages
    assert languages.source == {"eng": ()} and languages.default_source == "eng"
    assert languages.target == {c: TargetLanguage(source=(vocab[f">>{c}<<"],)) for c in ("fra", "deu")}
    assert languages.default_target is None


def test_src_lang_and_tgt_lang_name_the_pair_of_a_marian_that_names_none(marian_pair, tmp_path):
    """`twostep import --src-lang --tgt-lang`: the pair of a model whose files name none, or another; it is the
    artifact's after export."""
    from twostep.exporter.export import export

    bare = broken_copy(marian_pair, tmp_path, edit_tokenizer_config(source_lang=None, target_lang=None))
    result = twostep("import", bare, "--out", tmp_path / "ckpt", "--src-lang", "en", "--tgt-lang", "pt-BR")
    assert result.returncode == 0, result.stderr
    assert load_spec(tmp_path / "ckpt").languages == pair("en", "pt-BR")
    export(tmp_path / "ckpt", tmp_path / "art")
    languages = json.loads((tmp_path / "art" / "manifest.json").read_text())["tokenizer"]["languages"]
    assert (languages["source"], languages["default_target"]) == ({"en": []}, "pt-BR")
    result = twostep("import", marian_pair, "--out", tmp_path / "renamed", "--tgt-lang", "nl")
    assert result.returncode == 0, result.stderr
    assert load_spec(tmp_path / "renamed").languages == pair("en", "nl")


@pytest.mark.parametrize("family, args, fragments", [
    ("nllb", ["--src-lang", "en"], ["--src-lang names a bilingual model's source language", "its own tokens"]),
    ("mbart", ["--tgt-lang", "de"], ["--tgt-lang names a bilingual model's target language", "ar_AR, az_AZ"]),
    ("marian", ["--tgt-lang", "de"], ["its own tokens (deu, fra)", "leave --tgt-lang out"]),
    ("marian_pair", ["--src-lang", "xx"], ["--src-lang 'xx' is not one language's code", "BCP-47"]),
    ("marian_pair", ["--tgt-lang", "mul"], ["--tgt-lang 'mul' is not one language's code"]),
])
def test_naming_languages_a_model_cannot_take_is_one_line_and_nothing_is_written(request, tmp_path, family, args,
                                                                                 fragments):
    src = request.getfixturevalue(family if family == "marian_pair" else f"{family}_hf")
    out = tmp_path / "ckpt"
    one_line_error(twostep("import", src, "--out", out, *args), *fragments)
    assert not out.exists()
    assert leftovers(tmp_path) == []


# --- generate()'s decoding, recorded


def test_the_checkpoint_and_manifest_record_generates_decoding(pretrained):
    """transformers' beam search rule, and the generation config's max_length less the start token (the test
    models' 64; T5's and MADLAD's generation configs have none: twostep's own default stays)."""
    from twostep.artifact import load_artifact
    from twostep.model.checkpoint import read_decoding

    generation = json.loads((pretrained.hf / "generation_config.json").read_text())
    want = {"beam_stop": "transformers"}
    if pretrained.name in ("t5", "madlad"):
        assert "max_length" not in generation
    else:
        want["max_new_tokens"] = generation["max_length"] - 1
    assert read_decoding(pretrained.ckpt) == want
    assert load_artifact(pretrained.art).manifest.decoding == want


def test_no_repeat_ngram_size_decodes_as_generate_does_and_a_flag_undoes_it(nllb_hf, tmp_path):
    """An untrained NLLB repeats one token; with the generation config's no_repeat_ngram_size 2 (and num_beams,
    early_stopping) twostep decodes generate()'s tokens with no options (the eager backend on the checkpoint).
    `twostep translate --no-repeat-ngram-size 0` decodes with repeats allowed: a flag overrides the recorded
    defaults."""
    from twostep.model.hf import import_hf_directory
    from twostep.runtime.translator import open_translator

    settings = {"num_beams": 4, "early_stopping": True, "no_repeat_ngram_size": 2, "max_length": 21}
    hf = broken_copy(nllb_hf, tmp_path, edit_generation(**settings))
    ckpt = import_hf_directory(hf, tmp_path / "ckpt").path
    langs = {"src_lang": "eng_Latn", "tgt_lang": "fra_Latn"}
    sentences = hf_models.TEST_SENTENCES[:4]  # generate() is the slow part
    want = hf_models.reference(hf, sentences, None, beams=None, **langs)[0]
    translator, backend = open_translator(ckpt)
    with backend:
        got = translator.translate_ids(translator.encode(sentences, **langs), tgt_lang=langs["tgt_lang"])
        repeats = translator.translate(sentences, translator.options_with(no_repeat_ngram_size=0), **langs)
        texts = translator.translate(sentences, **langs)
    assert got == want
    assert repeats != texts
    result = twostep("translate", ckpt, *sentences, "--no-split", "--no-repeat-ngram-size", 0,
                     "--src-lang", langs["src_lang"], "--tgt-lang", langs["tgt_lang"])
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == repeats
