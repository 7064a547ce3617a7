"""The in-place decoders: ONNX Runtime's GroupQueryAttention (twostep export --inplace-cache, the default) or
opset 24's TensorScatter + Attention (--variant decoder_inplace_standard) writing the cache into one buffer.
Each must decode what eager PyTorch decodes, to the last token, through every way a decode moves its rows
(beams trading places, sentences leaving, the buffer growing), and leave the two plain graphs and every other
consumer of the artifact as they were."""

from __future__ import annotations

import numpy as np
import pytest

from twostep.artifact import load_artifact
from twostep.artifact.spec import INPLACE, STANDARD_INPLACE
from twostep.errors import BadInput
from twostep.exporter.validate import compare_sessions
from twostep.model.checkpoint import load_checkpoint
from twostep.runtime.backends.inplace import FIRST_CAPACITY, InplaceSession
from twostep.runtime.backends.ort import OrtBackend
from twostep.runtime.backends.torch_backend import TorchBackend
from twostep.runtime.decoding import DecodeOptions
from twostep.runtime.translator import Limits, Translator
from twostep.verify import test_sources as split_sources


@pytest.mark.parametrize("beam", [1, 4])
def test_decodes_the_whole_test_split_like_eager_pytorch(demo_inplace, demo_model_dir, beam):
    art = load_artifact(demo_inplace.path)
    sources = split_sources(art, None)
    options = DecodeOptions(beam_size=beam, n_best=min(beam, 2))
    with OrtBackend(art) as inplace, OrtBackend(art, kv_cache="standard") as standard, \
            OrtBackend(art, kv_cache="concat") as concat, TorchBackend(load_checkpoint(demo_model_dir).model) as eager:
        assert (inplace.decoder, standard.decoder) == (INPLACE, STANDARD_INPLACE)
        model_limits = Limits.of(art.config, art.config.max_positions)
        runs = [Translator(b.session(), model_limits, batch_size=32, options=options).decode_ids(sources)
                for b in (inplace, standard, concat, eager)]
    tokens = [[[h.tokens for h in hyps] for hyps in run] for run in runs]
    assert len(sources) == 1000
    assert tokens[0] == tokens[3], "in-place decoder differs from eager PyTorch"
    assert tokens[1] == tokens[3], "standard in-place decoder differs from eager PyTorch"
    assert tokens[2] == tokens[3]
    for run in runs[:2]:
        for got, want in zip(run, runs[3]):  # the scores agree to float32 noise
            assert [h.score for h in got] == pytest.approx([h.score for h in want], abs=1e-4)


@pytest.mark.parametrize("kv_cache", ["inplace", "standard"])
def test_sessions_agree_with_eager_through_reorders_leaving_rows_and_growth(demo_inplace, demo_model_dir, kv_cache):
    """compare_sessions is what export and verify run; here with a failure shown to be possible."""
    art = load_artifact(demo_inplace.path)
    with OrtBackend(art, kv_cache=kv_cache) as candidate, \
            TorchBackend(load_checkpoint(demo_model_dir).model) as reference:
        report = compare_sessions(candidate, reference, "fp32")
        assert report.ok, report.failures
        assert report.cases == 6 and report.max_error[f"{candidate.decoder}.logits"] < 1e-4
        assert 38 + 3 > FIRST_CAPACITY  # the schedule outgrows the first buffer

        class Broken(InplaceSession):  # a reorder that forgets the cache: the check must see it
            def reorder(self, origin, cache_only=False):
                if not cache_only:
                    super().reorder(origin, cache_only)

        broken = type("B", (), {"session": lambda self: Broken(candidate), "config": candidate.config,
                                "decoder": candidate.decoder})()
        assert not compare_sessions(broken, reference, "fp32").ok


@pytest.mark.parametrize("kv_cache", ["inplace", "standard"])
def test_the_cache_is_written_in_place(demo_inplace, kv_cache):
    """ONNX Runtime writes each step's keys and values into the session's own buffers (bound as both the past
    input and the present output), and hands back those buffers, not copies: nothing else holds the cache."""
    with OrtBackend(load_artifact(demo_inplace.path), kv_cache=kv_cache) as backend:
        session = backend.session()
        session.start(np.array([[5, 6, 3], [7, 3, 0]]), np.array([[1, 1, 1], [1, 1, 0]]))
        name = session.self_names[0]
        for step in range(3):
            before = session.cache[name].copy()
            session.step(np.array([[9], [10]]))
            buffer = session.cache[name]
            written = np.flatnonzero((buffer != before).any(axis=(0, 1, 3)))
            assert list(written) == [step], "the step's keys land at the rows' length, and only there"
            handed_back = {value.data_ptr() for value in session.binding.get_outputs()}
            assert all(session.cache[n].ctypes.data in handed_back for n in session.self_names)


def test_the_standard_decoder_takes_several_new_tokens_on_a_past(demo_inplace):
    """Its mask lets query t of a row see its past and the new tokens up to t: a two-token step gives the
    logits that two one-token steps give (GroupQueryAttention's CPU kernel refuses such a step)."""
    art = load_artifact(demo_inplace.path)
    ids, mask = np.array([[5, 6, 3], [7, 3, 0]]), np.array([[1, 1, 1], [1, 1, 0]])
    with OrtBackend(art, kv_cache="standard") as backend:
        together, apart = backend.session(), backend.session()
        for session in (together, apart):
            session.start(ids, mask)
            session.step(np.array([[2], [2]]))
        both = together.step(np.array([[9, 11], [10, 12]]))
        apart.step(np.array([[9], [10]]))
        np.testing.assert_allclose(both, apart.step(np.array([[11], [12]])), atol=1e-4)


def test_buffer_grows_to_max_positions_and_no_further(demo_inplace):
    art = load_artifact(demo_inplace.path)
    with OrtBackend(art) as backend:
        session = backend.session()
        session.start(np.array([[5, 6, 3], [7, 3, 0]]), np.array([[1, 1, 1], [1, 1, 0]]))
        steps = art.config.max_positions
        capacities = []
        for _ in range(steps):
            logits = session.step(np.array([[9], [10]]))
            capacities.append(session.capacity)
        assert np.isfinite(logits).all()
        assert sorted(set(capacities)) == [32, 64, 128] and session.capacity == art.config.max_positions
        with pytest.raises(BadInput, match="max_positions"):
            session.step(np.array([[9], [10]]))


def test_more_than_one_new_token_after_a_past_is_a_bad_input(demo_inplace):
    with OrtBackend(load_artifact(demo_inplace.path)) as backend:
        session = backend.session()
        session.start(np.array([[5, 6, 3], [7, 3, 0]]), np.array([[1, 1, 1], [1, 1, 0]]))
        assert session.step(np.array([[2, 9, 9], [2, 10, 10]])).shape == (2, art_vocab(backend))  # a first step may
        with pytest.raises(BadInput, match="one new token per step"):
            session.step(np.array([[9, 9], [10, 10]]))


def art_vocab(backend) -> int:
    return backend.config.tgt_vocab_size


def test_kv_cache_choices(demo_inplace, demo_artifact):
    with pytest.raises(BadInput, match="--inplace-cache"):
        OrtBackend(load_artifact(demo_artifact), kv_cache="inplace")
    with pytest.raises(BadInput, match="choose one of auto, inplace, standard, concat"):
        OrtBackend(load_artifact(demo_inplace.path), kv_cache="fast")
    with OrtBackend(load_artifact(demo_artifact)) as plain:  # auto: the plain decoder where there is no variant
        assert not plain.inplace and INPLACE not in plain.sessions
