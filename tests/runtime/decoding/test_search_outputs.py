"""The decoder's search outputs (twostep.artifact.spec: each row's best logits, their ids and its normaliser,
computed in the graph) stand in for the full logits: greedy and beam search read only them, and decode the
same tokens as from the full logits (and as eager PyTorch, whose session gives only logits), on both of
ort-cpu's decoders, fp32 and int8, on the pretrained families, and with sentences joining and leaving.

How ties are ordered: the graph's TopK gives equal logits lower id first; beam search ranks equal totals by
beam, then token id, as from the full logits. The one difference is the normaliser: log_norm is summed in
float32 in the graph, in float64 on the host, so totals may differ by its rounding (a few 1e-7 relative); a
tie between two beams' candidates that close can only be broken differently, never a tie within a row."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import hf_models
from conftest import SCORE_ATOL
from twostep.artifact import load_artifact
from twostep.exporter.validate import compare_sessions
from twostep.model.checkpoint import load_checkpoint
from twostep.runtime.backends.inplace import InplaceSession
from twostep.runtime.backends.ort import OrtBackend
from twostep.runtime.backends.torch_backend import TorchBackend
from twostep.runtime.decoding import DecodeOptions, Entry, RunningBatch, Specials, decode, kernels
from twostep.runtime.translator import Limits, Translator, open_translator
from twostep.verify import test_sources as split_sources


class Spy:
    """A step session that records whether each step asked for the full logits; `logits_only` makes it a
    session without search outputs (the host path, today's before them)."""

    def __init__(self, session, logits_only: bool = False):
        self.session, self.asked = session, []
        self.search_width = 0 if logits_only else session.search_width

    def __getattr__(self, name):
        return getattr(self.session, name)

    def search_step(self, input_ids, need_logits=True):
        self.asked.append(need_logits)
        return self.session.search_step(input_ids, need_logits)


def decode_split(backend, options, sources, logits_only=False):
    """[(tokens, score) of each hypothesis] of each sentence, and whether each step asked for the logits."""
    spy = Spy(backend.session(), logits_only)
    limits = Limits.of(backend.config, backend.config.max_positions)
    hyps = Translator(spy, limits, batch_size=32, options=options).decode_ids(sources)
    return [[(h.tokens, h.score) for h in hs] for hs in hyps], spy.asked


def tokens(run):
    return [[t for t, _ in hs] for hs in run]


@pytest.mark.parametrize("beam", [1, 4])
@pytest.mark.parametrize("kv_cache", ["inplace", "concat"])
def test_the_search_outputs_decode_the_test_split_as_the_full_logits_do(demo_inplace, demo_int8, kv_cache, beam):
    """fp32 and int8: the same tokens from the search outputs alone as from the full logits on the host, every
    step without the logits; fp32 scores equal to float32 noise (the eager comparison: test_inplace.py)."""
    options = DecodeOptions(beam_size=beam, n_best=min(beam, 2))
    for path in (demo_inplace.path, demo_int8):
        art = load_artifact(path)
        sources = split_sources(art, None)
        with OrtBackend(art, kv_cache=kv_cache) as backend:
            assert backend.spec(backend.decoder).searches
            got, asked = decode_split(backend, options, sources)
            want, _ = decode_split(backend, options, sources, logits_only=True)
        assert len(got) == 1000 and asked and not any(asked), "a step asked for the full logits"
        assert tokens(got) == tokens(want), f"{path}: the search outputs decode other tokens than the logits"
        for g, w in zip(got, want):
            assert [s for _, s in g] == pytest.approx([s for _, s in w], abs=1e-4)


def test_the_search_outputs_decode_the_test_split_as_eager_pytorch_does(demo_inplace, demo_model_dir):
    art = load_artifact(demo_inplace.path)
    sources = split_sources(art, None)[:200]
    for beam in (1, 4):
        options = DecodeOptions(beam_size=beam)
        with OrtBackend(art) as backend, TorchBackend(load_checkpoint(demo_model_dir).model) as eager:
            got, asked = decode_split(backend, options, sources)
            want, eager_asked = decode_split(eager, options, sources)
        assert not any(asked) and not eager_asked  # the eager session gives logits only: the host searches
        assert tokens(got) == tokens(want)


def test_wide_beams_and_sampling_ask_for_the_logits_and_decode_as_before(demo_inplace):
    """2 x beam + the blocked ids above the search width, and sampling: the full logits, every step; at the
    width, and greedy with eos suppressed, the search outputs, with the blocked ids skipped."""
    art = load_artifact(demo_inplace.path)
    sources = split_sources(art, None)[:24]
    with OrtBackend(art) as backend:
        width = backend.session().search_width
        assert width == 32
        for options in (DecodeOptions(beam_size=16, suppress_eos=True, max_new_tokens=6),
                        DecodeOptions(sampling=True, temperature=0.7, top_k=5, seed=3)):
            got, asked = decode_split(backend, options, sources)
            want, _ = decode_split(backend, options, sources, logits_only=True)
            assert asked and all(asked)
            assert tokens(got) == tokens(want)
        for options in (DecodeOptions(beam_size=15, suppress_eos=True, max_new_tokens=6),  # 30 candidates + eos
                        DecodeOptions(suppress_eos=True, max_new_tokens=12)):  # eos often the best: skipped
            got, asked = decode_split(backend, options, sources)
            want, _ = decode_split(backend, options, sources, logits_only=True)
            assert asked and not any(asked)
            assert tokens(got) == tokens(want)
            assert all(len(t) == options.max_new_tokens for hs in tokens(got) for t in hs)


def test_sentences_joining_and_leaving_a_running_batch_decode_as_alone(demo_inplace):
    """In-flight batching on the search outputs: greedy and beam sentences join at different steps, next to
    rows further on, and leave; each decodes what it decodes alone (from the logits)."""
    art = load_artifact(demo_inplace.path)
    sources = split_sources(art, None)[:12]
    specials = Specials.of(art.config)
    greedy, beam = DecodeOptions(max_new_tokens=30), DecodeOptions(beam_size=4, n_best=2, max_new_tokens=30)
    with OrtBackend(art) as backend:
        spy = Spy(backend.session())
        with spy.claimed():
            batch, results = RunningBatch(spy, specials=specials), {}
            waiting = [Entry(s, beam if i % 3 == 0 else greedy, 30, i) for i, s in enumerate(sources)]
            step = 0
            while waiting or batch.sentences:
                if waiting and step % 3 == 0:
                    finished = batch.add(waiting[:2])
                    del waiting[:2]
                else:
                    finished = batch.step()
                step += 1
                results.update({owner: [(h.tokens, h.score) for h in hyps] for owner, hyps in finished})
        assert spy.asked and not any(spy.asked)
        for i, s in enumerate(sources):
            options = beam if i % 3 == 0 else greedy
            alone = decode(Spy(backend.session(), logits_only=True), [s], options, specials=specials,
                           max_new_tokens=30)[0]
            assert [t for t, _ in results[i]] == [h.tokens for h in alone]


@pytest.mark.parametrize("beam", [1, 4])
def test_the_pretrained_families_decode_from_the_search_outputs_as_transformers_does(pretrained, beam):
    """Forced language tokens (M2M100) and never-generated ids (Marian's pad) on the search outputs; beam
    scores equal transformers' sequences_scores."""
    options = DecodeOptions(beam_size=beam, max_new_tokens=20, beam_stop="transformers")
    for kv_cache in ("inplace", "concat"):
        translator, backend = open_translator(pretrained.art, options=options, kv_cache=kv_cache)
        with backend:
            spy = Spy(translator.session)
            translator.session = spy
            langs = pretrained.langs
            sources = translator.encode(hf_models.TEST_SENTENCES, **langs)
            hyps = translator.decode_ids(sources, tgt_lang=langs.get("tgt_lang"))
        assert spy.asked and not any(spy.asked)
        want = pretrained.greedy if beam == 1 else pretrained.beam
        assert ([h[0].tokens for h in hyps], translator.best_texts(hyps)) == want
        if beam > 1:  # forced rows' log_norm is 0 here: the forced token's log-probability is 0, as in transformers
            scores = [h[0].score for h in hyps]
            assert np.allclose(scores, pretrained.beam_scores, rtol=0, atol=SCORE_ATOL), scores


def test_beam_candidates_from_the_search_outputs_equal_those_from_the_logits_ties_included():
    """With log_norm summed as the host sums it, the candidates and totals are bit-identical to beam_candidates,
    ties everywhere (rounded logits), dead beams and skipped ids included: equal totals rank by beam, then id."""
    rng = np.random.default_rng(0)
    for vocab, k, skip in ((50, 4, []), (300, 4, [2]), (1000, 6, [0, 2])):
        logits = np.round(rng.standard_normal((5 * k, vocab)) * 2).astype(np.float32)
        logits[::2, skip] = logits.max() + 1  # skipped ids the best of every other row
        scores = np.round(rng.standard_normal((5, k)), 1)
        scores[:, k - 1] = -np.inf
        scores[0, 1:] = -np.inf
        width = 2 * k + len(skip)
        order = np.argsort(-logits, axis=1, kind="stable")[:, :width]  # largest first, ties: lower id first
        top = np.take_along_axis(logits, order, 1)
        shifted = logits.astype(np.float64) - top[:, :1]
        log_norm = np.log(np.exp(shifted).sum(1))
        want = kernels.beam_candidates(logits.copy(), scores, 2 * k, skip)
        got = kernels.beam_candidates_from_top(top, order, log_norm, scores, 2 * k, vocab, skip)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])


def test_onnx_runtimes_topk_gives_equal_logits_lower_id_first():
    """The order the search outputs promise, from ONNX Runtime's TopK as the exported graphs run it."""
    graph = helper.make_graph(
        [helper.make_node("TopK", ["x", "k"], ["values", "ids"], axis=-1)], "topk",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, None])],
        [helper.make_tensor_value_info("values", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("ids", TensorProto.INT64, None)],
        [helper.make_tensor("k", TensorProto.INT64, [1], [32])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.round(np.random.default_rng(1).standard_normal((64, 3000))).astype(np.float32)  # ties everywhere
    _, ids = session.run(None, {"x": x})
    np.testing.assert_array_equal(ids, np.argsort(-x, axis=1, kind="stable")[:, :32])


def test_compare_sessions_catches_search_outputs_that_are_not_the_logits(demo_inplace, demo_model_dir):
    art = load_artifact(demo_inplace.path)
    with OrtBackend(art) as candidate, TorchBackend(load_checkpoint(demo_model_dir).model) as reference:
        assert compare_sessions(candidate, reference, "fp32").ok

        class Broken(InplaceSession):  # the second best's id where the best's should be
            def run_decoder(self, input_ids, need_logits=True):
                out, presents = super().run_decoder(input_ids, need_logits)
                out["top_ids"][:, [0, 1]] = out["top_ids"][:, [1, 0]]
                return out, presents

        broken = type("B", (), {"session": lambda self: Broken(candidate), "config": candidate.config,
                                "decoder": candidate.decoder})()
        failures = compare_sessions(broken, reference, "fp32").failures
        assert failures and all("top_ids" in f for f in failures)
