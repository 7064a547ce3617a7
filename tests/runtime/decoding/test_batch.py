"""In-flight batching (decoding.RunningBatch): a sentence decodes to the same tokens however it enters a batch.

Every way is driven here on the demo model's test split, against eager PyTorch: alone, in a batch that starts
together (static), joining a running batch on new rows at its end, on rows that finished sentences freed, and
staying while the batch is compacted around it; greedy and beam 4; on the plain ONNX decoder, the in-place
(GroupQueryAttention) decoder, and eager PyTorch's own step session.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from twostep.artifact import load_artifact
from twostep.model.checkpoint import load_checkpoint
from twostep.runtime.backends.ort import OrtBackend
from twostep.runtime.backends.torch_backend import TorchBackend
from twostep.runtime.decoding import DecodeOptions, Entry, RunningBatch, decode
from twostep.runtime.translator import Limits
from twostep.verify import test_sources as split_sources

OPTIONS = {"greedy": DecodeOptions(), "beam4": DecodeOptions(beam_size=4, n_best=2)}


class Spy:
    """A step session that notes how sentences entered: rows admitted (new or reused) and compactions."""

    def __init__(self, inner):
        self.inner, self.rows, self.reused, self.compactions, self.starts = inner, 0, 0, 0, 0

    def start(self, input_ids, attention_mask):
        self.starts += 1
        self.rows = len(input_ids)
        self.inner.start(input_ids, attention_mask)

    def admit(self, input_ids, attention_mask, sources, rows):
        self.reused += int((rows < self.rows).sum())
        self.rows = max(self.rows, int(rows.max()) + 1)
        self.inner.admit(input_ids, attention_mask, sources, rows)

    def release(self, rows):
        self.inner.release(rows)

    def reorder(self, origin, cache_only=False):
        if not cache_only:
            if self.rows and len(origin) < self.rows:
                self.compactions += 1
            self.rows = len(origin)
        self.inner.reorder(origin, cache_only)

    def step(self, input_ids):
        return self.inner.step(input_ids)

    def claimed(self):
        return self.inner.claimed()


def limit_of(limits: Limits, source: list[int]) -> int:
    return min(2 * len(source) + 16, limits.max_positions)


def drive(session, sources: list[list[int]], options: DecodeOptions, limits: Limits,
          first: int = 6) -> list:
    """`first` sentences start a batch; then before each step the next 0-3 join (1, 2, 3, 0, ...) until all
    have; until the batch is empty. Returns each sentence's hypotheses."""
    batch = RunningBatch(session, specials=limits.specials)
    results: list = [None] * len(sources)
    waiting = list(range(len(sources)))
    joins = itertools.cycle([1, 2, 3, 0])
    take = first
    while waiting or batch.sentences:
        joining, waiting = waiting[:take], waiting[take:]
        finished = batch.add([Entry(sources[i], options, limit_of(limits, sources[i]), i) for i in joining])
        if batch.sentences:
            finished += batch.step()
        for i, hyps in finished:
            results[i] = hyps
        take = next(joins)
    return results


@pytest.fixture(scope="module")
def demo(demo_artifact, demo_model_dir):
    art = load_artifact(demo_artifact)
    return art, split_sources(art, None), Limits.of(art.config, art.config.max_positions), \
        load_checkpoint(demo_model_dir).model


@pytest.fixture(scope="module")
def eager_static(demo):
    """Eager PyTorch, the whole split in one static batch, each sentence with its own limit."""
    art, sources, limits, model = demo
    with TorchBackend(model) as eager:
        return {name: decode(eager.session(), sources, options, specials=limits.specials, max_new_tokens=0,
                             limits=[limit_of(limits, s) for s in sources])
                for name, options in OPTIONS.items()}


def tokens(results) -> list:
    return [[h.tokens for h in hyps] for hyps in results]


def scores(results) -> list:
    return [h.score for hyps in results for h in hyps]


@pytest.mark.parametrize("name", OPTIONS)
def test_alone_matches_a_static_batch_in_eager_pytorch(demo, eager_static, name):
    art, sources, limits, model = demo
    some = sources[:: max(len(sources) // 24, 1)]  # every kind of length, one at a time
    with TorchBackend(model) as eager:
        session = eager.session()
        alone = [decode(session, [s], OPTIONS[name], specials=limits.specials,
                        max_new_tokens=limit_of(limits, s))[0] for s in some]
    want = eager_static[name][:: max(len(sources) // 24, 1)]
    assert tokens(alone) == tokens(want)
    assert scores(alone) == pytest.approx(scores(want), abs=1e-4)


@pytest.mark.parametrize("name", OPTIONS)
@pytest.mark.parametrize("backend", ["ort-cpu", "ort-cpu-inplace", "torch"])
def test_sentences_joining_a_running_batch_decode_as_eager_pytorch_does(demo, demo_inplace, eager_static,
                                                                         backend, name):
    art, sources, limits, model = demo
    if backend == "torch":
        opened = TorchBackend(model)
    else:
        opened = OrtBackend(load_artifact(demo_inplace.path) if backend.endswith("inplace") else art, threads=2)
    with opened as be:
        assert backend != "ort-cpu-inplace" or be.inplace
        spy = Spy(be.session())
        got = drive(spy, sources, OPTIONS[name], limits)
    # every way in was taken: a batch started afresh, rows reused, new rows added, compactions
    assert spy.starts >= 1 and spy.reused > 0 and spy.compactions > 0
    want = eager_static[name]
    bad = [i for i, (g, w) in enumerate(zip(tokens(got), tokens(want))) if g != w]
    assert not bad, f"{len(bad)} of {len(sources)} sentences differ from eager PyTorch, first #{bad[0]}"
    assert scores(got) == pytest.approx(scores(want), abs=1e-4)


@pytest.fixture(scope="module", params=["ort-cuda", "torch-cuda"])
def gpu_backend(request) -> str:
    """Skipped (before the eager reference is computed) where the backend cannot run."""
    from twostep.runtime import backends

    reason = (backends.unavailable_reason("torch", device="cuda") if request.param == "torch-cuda"
              else backends.unavailable_reason(request.param))
    if reason:
        pytest.skip(f"{request.param} unavailable here: {reason}")
    return request.param


@pytest.mark.gpu
@pytest.mark.parametrize("name", OPTIONS)
def test_sentences_joining_a_running_batch_on_a_gpu_decode_as_eager_pytorch_does(gpu_backend, demo, eager_static,
                                                                                name):
    """The device paths (rows moved by ONNX Runtime graphs or torch on the GPU): scripts/gpu-check runs it."""
    from twostep.runtime import backends

    art, sources, limits, model = demo
    opened = (TorchBackend(model, device="cuda") if gpu_backend == "torch-cuda"
              else backends.create(gpu_backend, artifact=art))
    with opened as be:
        spy = Spy(be.session())
        got = drive(spy, sources, OPTIONS[name], limits)
    assert spy.reused > 0 and spy.compactions > 0
    assert tokens(got) == tokens(eager_static[name])
    assert scores(got) == pytest.approx(scores(eager_static[name]), abs=1e-3)


def test_limits_and_options_per_sentence_in_one_running_batch(demo, eager_static):
    """Greedy and beam sentences in one batch, each joining at a different step, each with its own limit."""
    art, sources, limits, model = demo
    some = sources[:40]
    with OrtBackend(art, threads=2) as be:
        batch = RunningBatch(be.session(), specials=limits.specials)
        results: dict = {}
        for i, s in enumerate(some):
            name = "beam4" if i % 3 == 0 else "greedy"
            for owner, hyps in batch.add([Entry(s, OPTIONS[name], limit_of(limits, s), (name, i))]):
                results[owner] = hyps
            for owner, hyps in batch.step():
                results[owner] = hyps
        while batch.sentences:
            for owner, hyps in batch.step():
                results[owner] = hyps
    for (name, i), hyps in results.items():
        assert [h.tokens for h in hyps] == [h.tokens for h in eager_static[name][i]], (name, i)
    assert len(results) == len(some)
    assert np.isfinite(scores(results.values())).all()
