"""The T5 family (twostep/model/hf/t5.py) beyond the pretrained suite, which holds T5 v1.1's and MADLAD's parity
on every path (tests/guarantees/test_pretrained.py, tests/serving, tests/cpp): T5 v1.0's tied, scaled output layer;
the standard in-place decoder (opset 24's Attention with the bias in its mask) and what TensorRT's parser would
say; sharded weights; the bucket rule itself; and what is refused, in one line."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

import hf_models
from cli_helpers import assert_user_error, leftovers, twostep
from conftest import NEW_TOKENS, SCORE_ATOL

ONLY_MADLAD = pytest.mark.parametrize("pretrained", ["madlad"], indirect=True)


def test_relative_buckets_are_transformers_buckets():
    """The bucket of every relative position, both directions, past max_distance too, as T5Attention computes it."""
    from transformers.models.t5.modeling_t5 import T5Attention

    from twostep.model.transformer import relative_buckets

    relative = torch.arange(-300, 301)
    for bidirectional in (True, False):
        for buckets, distance in ((32, 128), (8, 20), (6, 7)):
            want = T5Attention._relative_position_bucket(relative, bidirectional, buckets, distance)
            assert torch.equal(relative_buckets(relative, bidirectional, buckets, distance), want)


def test_t5_v1_0_tied_and_scaled_output_layer_gives_transformers_logits(tmp_path):
    """T5 v1.0: relu feed-forward, the output layer tied to the shared embedding and fed the decoder's output times
    d_model ** -0.5 (transformers' scale_decoder_outputs); twostep's eager model gives transformers' logits."""
    from transformers import T5Config, T5ForConditionalGeneration, T5Tokenizer

    from twostep.model.checkpoint import load_checkpoint
    from twostep.model.hf import import_hf_directory

    spm_file = hf_models.train_spm(tmp_path / "spiece.model", hf_models.SOURCE_TEXT, 60, model_type="unigram",
                                   pad_id=0, eos_id=1, unk_id=2, bos_id=-1)
    tokenizer = T5Tokenizer.from_pretrained(tmp_path, extra_ids=3)
    config = T5Config(vocab_size=len(tokenizer), feed_forward_proj="relu", **hf_models.T5_SIZES)
    model = T5ForConditionalGeneration(config).eval()
    hf_models.randomize(model, 0, std=0.3)
    assert model.config.scale_decoder_outputs
    model.save_pretrained(tmp_path / "hf")
    tokenizer.save_pretrained(tmp_path / "hf")  # tokenizer_config.json's extra_ids 3
    (tmp_path / "hf" / "tokenizer.json").unlink()  # T5's ids from spiece.model (the hub's older layout)
    shutil.copy(spm_file, tmp_path / "hf" / "spiece.model")
    import_hf_directory(tmp_path / "hf", tmp_path / "ckpt")
    ours = load_checkpoint(tmp_path / "ckpt")
    c = ours.model.config
    assert (c.tie_generator, c.gated_ffn, c.activation, c.logit_scale) == (True, False, "relu", 32 ** -0.5)
    src = torch.tensor([[5, 9, 13, 21, 7, 1], [4, 8, 12, 1, 0, 0]])
    mask = (src != 0).long()
    mask[0, -1] = 1
    tgt = torch.tensor([[0, 6, 11, 3, 17, 29, 8, 40], [0, 14, 2, 9, 30, 5, 22, 12]])
    with torch.no_grad():
        want = model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits
        got = ours.model(src, mask, tgt)
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), float((got - want).abs().max())
    # the extra ids numbered after the pieces, <extra_id_0> last, as T5Tokenizer numbers them
    vocab = json.loads((tmp_path / "ckpt" / "source_vocab.json").read_text())
    assert [vocab[f"<extra_id_{k}>"] for k in range(3)] == \
        tokenizer.convert_tokens_to_ids(["<extra_id_0>", "<extra_id_1>", "<extra_id_2>"])


@ONLY_MADLAD
def test_the_standard_in_place_decoder_carries_the_bias_in_its_mask(pretrained, tmp_path):
    """decoder_inplace_standard: opset 24's Attention takes the relative bias, the masked positions at the dtype's
    minimum, as its float mask; it decodes transformers' tokens, greedy and beam 4, and TensorRT's parser would take
    it and the plain graphs (the in-place contrib variant is ONNX Runtime's alone)."""
    from twostep.exporter.export import export
    from twostep.exporter.trt_compat import check_trt_compatible
    from twostep.runtime.decoding import DecodeOptions
    from twostep.runtime.translator import open_translator

    art = export(pretrained.ckpt, tmp_path / "art", also=["decoder_inplace_standard"]).path
    for graph in ("encoder.onnx", "decoder.onnx", "decoder_inplace_standard.onnx"):
        assert check_trt_compatible(art / graph) == [], graph
    for options, want in ((DecodeOptions(max_new_tokens=NEW_TOKENS), pretrained.greedy),
                          (DecodeOptions(beam_size=4, max_new_tokens=NEW_TOKENS, beam_stop="transformers"),
                           pretrained.beam)):
        translator, backend = open_translator(art, options=options, kv_cache="standard")
        with backend:
            assert backend.decoder == "decoder_inplace_standard"
            ids = translator.encode(hf_models.TEST_SENTENCES, **pretrained.langs)
            hyps = translator.decode_ids(ids, tgt_lang=pretrained.langs["tgt_lang"])
        assert ([h[0].tokens for h in hyps], translator.best_texts(hyps)) == want
        if options.beam_size > 1:
            assert max(abs(h[0].score - s) for h, s in zip(hyps, pretrained.beam_scores)) < SCORE_ATOL


@ONLY_MADLAD
def test_sharded_weights_import_as_one_file_does(pretrained, tmp_path):
    from transformers import T5ForConditionalGeneration

    from twostep.model.checkpoint import load_checkpoint
    from twostep.model.hf import import_hf_directory

    sharded = tmp_path / "sharded"
    shutil.copytree(pretrained.hf, sharded)
    (sharded / "model.safetensors").unlink()
    T5ForConditionalGeneration.from_pretrained(pretrained.hf).save_pretrained(sharded, max_shard_size="20KB")
    (sharded / "config.json").write_text((pretrained.hf / "config.json").read_text())
    assert (sharded / "model.safetensors.index.json").is_file() and not (sharded / "model.safetensors").exists()
    import_hf_directory(sharded, tmp_path / "ckpt")
    want = load_checkpoint(pretrained.ckpt).model.state_dict()
    got = load_checkpoint(tmp_path / "ckpt").model.state_dict()
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)


@ONLY_MADLAD
def test_madlad_lists_its_languages_and_refuses_one_it_has_no_token_for(pretrained):
    """Each <2xx> piece is a target language and a source language (no token); a target without one is refused in
    one line naming those it has (400 over HTTP: tests/serving/test_http.py)."""
    from twostep.artifact.store import load_artifact

    languages = load_artifact(pretrained.art).tokenizer.languages
    assert sorted(languages.target) == sorted(hf_models.MADLAD_CODES) == sorted(languages.source)
    assert all(ids == () for ids in languages.source.values())
    result = twostep("translate", pretrained.art, "hello", "--tgt-lang", "pt")
    assert_user_error(result, "unknown target language 'pt': this model has de, en, fr, zh_Latn")


def edited(src, out, config=None, added=None):
    """A copy of a T5 directory with config.json's keys changed and tokens added to tokenizer.json."""
    shutil.copytree(src, out)
    if config:
        data = json.loads((out / "config.json").read_text())
        (out / "config.json").write_text(json.dumps({**data, **config}))
    if added:
        data = json.loads((out / "tokenizer.json").read_text())
        data["added_tokens"] += [{"id": i, "content": piece, "single_word": False, "lstrip": False, "rstrip": False,
                                  "normalized": False, "special": True} for piece, i in added.items()]
        (out / "tokenizer.json").write_text(json.dumps(data))
    return out


@ONLY_MADLAD
@pytest.mark.parametrize("case", ["feed_forward_proj", "d_model", "tokenizer_size", "no_tokenizer"])
def test_what_twostep_does_not_run_is_refused_in_one_line(pretrained, tmp_path, case):
    rows = json.loads((pretrained.hf / "config.json").read_text())["vocab_size"]
    if case == "feed_forward_proj":
        src = edited(pretrained.hf, tmp_path / "hf", config={"feed_forward_proj": "gated-mish"})
        message = "feed_forward_proj 'gated-mish' is not one twostep runs"
    elif case == "d_model":
        src = edited(pretrained.hf, tmp_path / "hf", config={"d_model": None})
        message = "d_model None is not a size"
    elif case == "tokenizer_size":
        src = edited(pretrained.hf, tmp_path / "hf", added={"<extra>": rows + 4})
        message = f"tokenizer.json has ids up to {rows + 4}, but the model's embedding has {rows} rows"
    else:
        src = edited(pretrained.hf, tmp_path / "hf")
        (src / "tokenizer.json").unlink()
        (src / "spiece.model").unlink()
        message = "no tokenizer files; a T5 model needs spiece.model or tokenizer.json"
    result = twostep("import", src, "--out", tmp_path / "ckpt")
    assert_user_error(result, message)
    assert not (tmp_path / "ckpt").exists() and not leftovers(tmp_path)


@pytest.mark.parametrize("pretrained", ["t5"], indirect=True)
def test_a_t5_of_one_pair_is_named_at_import(pretrained, tmp_path):
    """A T5 without <2xx> pieces has no languages of its own; --src-lang/--tgt-lang name its pair, which adds no
    token: the same source ids as before, the pair listed."""
    from twostep.model.checkpoint import load_checkpoint

    assert load_checkpoint(pretrained.ckpt).tokenizer.languages.target == {}
    result = twostep("import", pretrained.hf, "--out", tmp_path / "ckpt", "--src-lang", "en", "--tgt-lang", "de")
    assert result.returncode == 0, result.stderr
    spec = load_checkpoint(tmp_path / "ckpt").tokenizer
    assert (list(spec.languages.source), list(spec.languages.target)) == (["en"], ["de"])
    assert spec.languages.target["de"].source == spec.languages.source["en"] == ()
