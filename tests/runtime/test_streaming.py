"""Streaming (twostep/runtime/streaming.py, Translator.stream): text deltas of growing token lists with the real
tokenizers, and the events of a stream against translate()'s outputs on the exported demo model."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hf_models
from twostep.artifact import load_artifact
from twostep.artifact.tokenizer import TokenizerSpec
from twostep.model.checkpoint import read_tokenizer
from twostep.runtime import backends
from twostep.runtime.decoding import DecodeOptions
from twostep.runtime.streaming import Delta, SentenceDone, TextDeltas
from twostep.runtime.tokenizer import Tokenizer
from twostep.runtime.translator import Limits, Translator

BYTE_TEXT = ["the cat sat on the mat", "le chat est sur le tapis", "schön été naïve", "猫が座った"]


def imported(tmp, build) -> Tokenizer:
    """The tokenizer twostep imports with a pretrained family's model (untrained: only its tokenizer matters)."""
    from twostep.model.hf import import_hf_directory

    import_hf_directory(build(tmp / "hf"), tmp / "ckpt")
    return Tokenizer.load(tmp / "ckpt", read_tokenizer(tmp / "ckpt"))


def byte_fallback_json(tmp) -> Tokenizer:
    """A tokenizers file of a byte-fallback SentencePiece model's pieces whose decoder is Llama's: ByteFallback
    turns a run of byte pieces into its text, or into one U+FFFD per piece while they are not valid UTF-8."""
    import sentencepiece
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders
    from tokenizers.models import Unigram

    sp = sentencepiece.SentencePieceProcessor(
        model_file=str(hf_models.train_spm(tmp / "bytes.model", BYTE_TEXT, 300, byte_fallback=True)))
    pieces = [(sp.id_to_piece(i), sp.get_score(i)) for i in range(sp.get_piece_size())]
    hf = HFTokenizer(Unigram(pieces, unk_id=sp.unk_id(), byte_fallback=True))
    hf.add_special_tokens(["<s>", "</s>"])
    hf.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                    decoders.Strip(" ", 1, 0)])
    hf.save(str(tmp / "tokenizer.json"))
    return Tokenizer.load(tmp, TokenizerSpec(source_model="tokenizer.json", target_model="tokenizer.json",
                                             source_suffix=(sp.eos_id(),), drop_ids=(), unk_id=sp.unk_id(),
                                             kind="tokenizers"))


TOKENIZERS = {  # name: how to make it in a temporary directory
    "demo": lambda tmp, demo: Tokenizer.sentencepiece(demo / "tokenizer.model"),
    "sentencepiece-bytes": lambda tmp, demo: Tokenizer.sentencepiece(
        hf_models.train_spm(tmp / "bytes.model", BYTE_TEXT, 300, byte_fallback=True)),
    "marian": lambda tmp, demo: imported(tmp, lambda out: hf_models.marian_dir(out, train_steps=0)),
    "mbart50": lambda tmp, demo: imported(tmp, lambda out: hf_models.mbart50_dir(out, train_steps=0)),
    "nllb-json": lambda tmp, demo: imported(tmp, lambda out: hf_models.nllb_dir(out, with_spm=False, train_steps=0)),
    "tokenizers-bytes": lambda tmp, demo: byte_fallback_json(tmp),
}


@pytest.fixture(scope="module", params=list(TOKENIZERS))
def tokenizer(request, tmp_path_factory, demo_model_dir) -> Tokenizer:
    return TOKENIZERS[request.param](tmp_path_factory.mktemp(request.param), demo_model_dir)


def streamed(tokenizer: Tokenizer, tokens: list[int]) -> list[str]:
    """The deltas of `tokens` growing one at a time, then the rest."""
    text = TextDeltas(tokenizer)
    return [text.update(tokens[:n]) for n in range(1, len(tokens) + 1)] + [text.finish(tokens)]


def vocab_size(tokenizer: Tokenizer) -> int:
    pieces = getattr(tokenizer, "target_pieces", None)  # a table of its own (a JsonTokenizer has none)
    return tokenizer.vocab_size if pieces is None else max(pieces) + 1


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_deltas_concatenated_are_the_final_text_and_never_split_a_character(tokenizer, data):
    """Random token sequences, weighted towards byte pieces and pieces of no text (special tokens), where a
    prefix's text is most often not a prefix of the whole's."""
    size = vocab_size(tokenizer)
    odd = [t for t in range(size) if tokenizer.is_byte(t) or not tokenizer.decode([t])][:400]
    token = st.integers(0, size - 1) | st.sampled_from(odd or [0])
    tokens = data.draw(st.lists(token, max_size=24))
    deltas = streamed(tokenizer, tokens)
    assert "".join(deltas) == tokenizer.decode(tokens)
    assert all("\ufffd" not in d or d.rstrip("\ufffd") for d in deltas[:-1]), deltas  # no half character alone


def test_a_character_of_byte_pieces_comes_whole(tokenizer):
    byte = {tokenizer.target_piece(t): t for t in range(vocab_size(tokenizer)) if tokenizer.is_byte(t)}
    if not byte:
        pytest.skip("no byte-fallback pieces in this tokenizer")
    word = [t for t in tokenizer.encode_target("the cat") if not tokenizer.is_byte(t)]
    tokens = word + [byte[f"<0x{b:02X}>"] for b in "猫".encode()] + word
    deltas = streamed(tokenizer, tokens)
    assert "".join(deltas) == tokenizer.decode(tokens) and "猫" in tokenizer.decode(tokens)
    assert not any("\ufffd" in d for d in deltas), deltas


def test_a_token_whose_text_may_change_waits_for_the_next(tmp_path):
    """The last token waits for the next one, and a run of byte pieces (with a piece of no text inside) for a token
    past its end, as the run could go on: 猫 in three byte pieces comes whole, two tokens after its last byte."""
    tokenizer = TOKENIZERS["sentencepiece-bytes"](tmp_path, None)
    piece = {tokenizer.target_piece(t): t for t in range(tokenizer.vocab_size)}
    cat = [piece[f"<0x{b:02X}>"] for b in "猫".encode()]
    word = tokenizer.encode_target("the cat")
    for run in (cat, [*cat[:2], piece["</s>"], cat[2]]):  # </s>: a piece decode leaves out
        tokens = word + run + word
        deltas = streamed(tokenizer, tokens)
        given = ["".join(deltas[: n + 1]) for n in range(len(tokens))]  # after tokens[: n + 1]
        assert given[: len(word) + 1] == [tokenizer.decode(word[:n]) for n in range(len(word) + 1)]
        assert given[len(word) + len(run)] == "the cat"  # the run's last piece, then the next word's first
        assert given[len(word) + len(run) + 1] == tokenizer.decode(word + run + word[:1]) == "the cat猫 t"
        assert "".join(deltas) == tokenizer.decode(tokens) == "the cat猫 the cat"


# -- Translator.stream on the exported demo model -----------------------------------------------------------


@pytest.fixture(scope="module")
def demo(demo_artifact):
    artifact = load_artifact(demo_artifact)
    with backends.create("ort-cpu", artifact=artifact, threads=2) as backend:
        tokenizer = Tokenizer.load(artifact.path, artifact.tokenizer)
        yield Translator(backend.session(), Limits.of(artifact.config), tokenizer, batch_size=4)


@pytest.fixture(scope="module")
def texts() -> list[str]:
    from twostep.model.tasks import get_task

    return [source for source, _ in get_task("numbers-en-de").split("test")][:10]


def by_sentence(events) -> tuple[dict[int, str], dict[int, SentenceDone], list]:
    """Each sentence's deltas joined, its SentenceDone, and the events in order."""
    events = list(events)
    text: dict[int, str] = {}
    done = {}
    for e in events:
        if isinstance(e, Delta):
            assert e.sentence not in done, f"a delta of sentence {e.sentence} after it was done"
            assert e.text
            text[e.sentence] = text.get(e.sentence, "") + e.text
        else:
            assert e.sentence not in done
            done[e.sentence] = e
    return text, done, events


@pytest.mark.parametrize("options", [DecodeOptions(), DecodeOptions(sampling=True, temperature=0.8, seed=7),
                                     DecodeOptions(max_new_tokens=3)], ids=["greedy", "sampling", "cut-short"])
def test_stream_deltas_are_translate_s_text_sentence_by_sentence(demo, texts, options):
    want = demo.translate(texts, options)
    text, done, events = by_sentence(demo.stream(texts, options))
    assert [text.get(i, "") for i in range(len(texts))] == want
    assert [done[i].text for i in range(len(texts))] == want
    assert sum(isinstance(e, Delta) for e in events) > len(texts)  # text comes as it decodes, not at the end


def test_beam_search_streams_each_sentence_when_it_is_done_and_no_deltas(demo, texts):
    options = DecodeOptions(beam_size=3, n_best=2)
    want = demo.translate_nbest(texts, options)
    text, done, events = by_sentence(demo.stream(texts, options))
    assert not text
    assert [[h for h, _ in done[i].hypotheses] for i in range(len(texts))] == [[h for h, _ in w] for w in want]
    assert [done[i].text for i in range(len(texts))] == [w[0][0] for w in want]
    order = [e.sentence for e in events]
    assert order != sorted(order)  # in the order they finish, not the input's


def test_the_running_batch_reports_only_streaming_sentences_and_stops_counting_them_as_they_leave(demo, texts):
    """RunningBatch.progress: the tokens so far of the sentences that joined with `stream`, prefixes of their
    final tokens without eos or a forced prefix (sentence 4's); `streaming` counts them down to 0 as they finish
    (then a step asks nothing)."""
    from twostep.runtime.decoding import Entry, RunningBatch

    ids = demo.encode(texts[:4])
    batch = RunningBatch(demo.session, specials=demo.limits.specials)
    seen: dict[int, list[list[int]]] = {}
    final = {}
    with demo.session.claimed():
        batch.add([Entry(s, DecodeOptions(), 40, i, stream=i % 2 == 0) for i, s in enumerate(ids)]
                  + [Entry(ids[0], DecodeOptions(), 40, 4, prefix=(7, 8), stream=True)])
        while batch.sentences:
            final.update(batch.step())
            assert batch.streaming == sum(owner % 2 == 0 for owner in batch.owners())
            for owner, tokens in batch.progress():
                seen.setdefault(owner, []).append(tokens)
    assert batch.streaming == 0 and set(seen) == {0, 2, 4}
    for owner, reports in seen.items():
        whole = final[owner][0].tokens
        assert reports == [whole[:n] for n in range(1, len(whole) + 1)][: len(reports)]
        assert len(reports) == len(whole)  # one a step, the last before eos
