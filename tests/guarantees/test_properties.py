"""Property tests (hypothesis): arbitrary text, token ids, decode options and manifests give a result or one
typed error, never a crash, a hang or a wrong-shaped result; decoding invariants hold on the real demo model.
Examples are bounded (`settings` below) so that the whole file runs in about a minute on 2 cores."""

from __future__ import annotations

import copy
import json
import shutil

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from num2words import num2words

import search
from cpp_helpers import translate_cpp
from twostep.artifact import load_artifact
from twostep.errors import BadArtifact, BadInput
from twostep.runtime.decoding import DecodeOptions, Specials
from twostep.runtime.decoding.options import BOUNDS
from twostep.runtime.translator import Limits, Translator, open_translator

bounded = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)

numbers = st.integers(min_value=0, max_value=999_999)
sentences = st.lists(numbers.map(lambda n: num2words(n)), min_size=1, max_size=6)


@pytest.fixture(scope="module")
def demo(demo_artifact):
    translator, backend = open_translator(demo_artifact, "ort-cpu")
    with backend:
        yield translator, backend


@pytest.fixture(scope="module")
def tiny_backend(tiny_artifact):
    translator, backend = open_translator(tiny_artifact[0], "ort-cpu")
    with backend:
        yield backend


def translator_with(backend, tokenizer, options: DecodeOptions, batch_size: int = 32) -> Translator:
    return Translator(backend.session(), Limits.of(backend.config), tokenizer, batch_size, options)


def assert_well_formed(results, sources, options: DecodeOptions, config) -> None:
    assert len(results) == len(sources)
    want = options.n_best if options.beam_size > 1 else 1
    for hyps in results:
        assert 1 <= len(hyps) <= want
        for h in hyps:
            assert all(isinstance(t, int) and 0 <= t < config.tgt_vocab_size for t in h.tokens)
            assert config.eos_id not in h.tokens and len(h.tokens) <= config.max_positions


def test_any_text_gives_translations_or_one_typed_error(demo):
    translator, _ = demo
    seen = {"result": 0, "error": 0}

    @settings(bounded, max_examples=60)
    @given(st.lists(st.text(max_size=200) | sentences.map(" ".join), min_size=1, max_size=4))
    def prop(texts):
        try:
            out = translator.translate(texts)
        except BadInput:
            seen["error"] += 1
            return
        seen["result"] += 1
        assert len(out) == len(texts) and all(isinstance(t, str) for t in out)

    prop()
    assert seen["result"] >= 20 and seen["error"] > 0, seen


token_ids = st.one_of(st.integers(-5, 300), st.integers(-2**70, 2**70), st.sampled_from([1.5, "7", None, True]))
id_lists = st.lists(st.integers(4, 255), min_size=1, max_size=40) | st.lists(token_ids, max_size=160)


def test_any_token_id_batches_give_hypotheses_or_one_typed_error(demo):
    translator, backend = demo
    seen = {"result": 0, "error": 0}

    @settings(bounded, max_examples=60)
    @given(st.lists(id_lists, max_size=5))
    def prop(sources):
        try:
            results = translator.decode_ids(sources)
        except BadInput:
            seen["error"] += 1
            return
        seen["result"] += 1
        assert_well_formed(results, sources, translator.options, backend.config)

    prop()
    assert seen["result"] >= 15 and seen["error"] > 0, seen


reasonable = st.floats(0.05, 3.0)
unreasonable = st.floats(allow_nan=True, allow_infinity=True)


def within(name: str) -> st.SearchStrategy:
    """Any value an option's bound admits, its ends included (hypothesis tries them first)."""
    bound = BOUNDS[name]
    return st.floats(bound.low, bound.high, exclude_min=bound.low_open)


options_kwargs = st.fixed_dictionaries({}, optional={
    "beam_size": st.integers(-1, 5), "n_best": st.integers(-1, 6),
    "length_penalty": reasonable | within("length_penalty") | unreasonable,
    "sampling": st.booleans(), "temperature": reasonable | within("temperature") | unreasonable,
    "top_k": st.integers(-2, 300),
    "top_p": st.floats(0.05, 1.0) | unreasonable, "seed": st.none() | st.integers(-3, 2**64),
    "max_new_tokens": st.none() | st.integers(-1, 300), "suppress_eos": st.booleans(),
})


def test_any_decode_options_give_hypotheses_or_one_typed_error(demo):
    translator, backend = demo
    seen = {"result": 0, "error": 0}

    @settings(bounded, max_examples=80)
    @given(options_kwargs, sentences)
    def prop(kwargs, texts):
        try:
            options = DecodeOptions(**kwargs)
        except BadInput:
            seen["error"] += 1
            return
        seen["result"] += 1
        sources = translator.encode(texts)
        results = translator_with(backend, translator.tokenizer, options).decode_ids(sources)
        assert_well_formed(results, sources, options, backend.config)
        if options.suppress_eos and options.max_new_tokens and not options.sampling:
            expected = min(options.max_new_tokens, backend.config.max_positions)
            assert all(len(h.tokens) == expected for hyps in results for h in hyps)

    prop()
    assert seen["result"] >= 15 and seen["error"] > 0, seen


@bounded
@given(sentences, st.sampled_from(["demo", "tiny"]))
def test_beam_1_equals_greedy(demo, tiny_backend, texts, model):
    translator, backend = demo
    sources = translator.encode(texts)
    if model == "tiny":  # a random model: near-ties everywhere
        rng = np.random.default_rng(len(texts))
        sources = [rng.integers(4, 50, len(s)).tolist() + [3] for s in sources]
        backend = tiny_backend
    c = backend.config
    common = dict(specials=Specials.of(c), max_new_tokens=40)
    greedy = search.greedy(backend.session(), sources, **common)
    beam = search.beam_search(backend.session(), sources, beam_size=1, **common)
    assert [hyps[0].tokens for hyps in beam] == greedy


@bounded
@given(sentences, st.integers(2, 5), st.data())
def test_n_best_is_sorted_by_score_and_unique(demo, texts, beam, data):
    translator, backend = demo
    options = DecodeOptions(beam_size=beam, n_best=data.draw(st.integers(1, beam)),
                            length_penalty=data.draw(st.sampled_from([0.0, 0.6, 1.0, 2.0])))
    results = translator_with(backend, translator.tokenizer, options).decode_ids(translator.encode(texts))
    for hyps in results:
        scores = [h.score for h in hyps]
        assert scores == sorted(scores, reverse=True)
        assert len({tuple(h.tokens) for h in hyps}) == len(hyps)


@bounded
@given(sentences, st.permutations(range(6)), st.integers(1, 6), st.sampled_from([1, 3]))
def test_outputs_do_not_depend_on_batch_composition_or_order(demo, texts, order, batch_size, beam):
    translator, backend = demo
    options = DecodeOptions(beam_size=beam)
    sources = translator.encode(texts)
    alone = [translator_with(backend, None, options).decode_ids([s])[0] for s in sources]
    order = [i for i in order if i < len(sources)]
    shuffled = translator_with(backend, None, options, batch_size).decode_ids([sources[i] for i in order])
    assert [[h.tokens for h in hyps] for hyps in shuffled] == [[h.tokens for h in alone[i]] for i in order]


@bounded
@given(sentences, st.integers(1, 30), st.integers(0, 2**32))
def test_eos_ends_every_strategy_and_is_never_output(demo, texts, max_new, seed):
    translator, backend = demo
    c = backend.config
    sources = translator.encode(texts)
    common = dict(specials=Specials.of(c), max_new_tokens=max_new)
    for out in (search.greedy(backend.session(), sources, **common),
                search.sample(backend.session(), sources, seed=seed, **common),
                [h[0].tokens for h in search.beam_search(backend.session(), sources, beam_size=2, **common)]):
        assert all(c.eos_id not in tokens and len(tokens) <= max_new for tokens in out)
    suppressed = search.greedy(backend.session(), sources, suppress_eos=True, **common)
    assert all(len(tokens) == max_new for tokens in suppressed)


# -- manifests ---------------------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)


def paths(node, prefix=()):
    yield prefix
    children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in children:
        yield from paths(child, (*prefix, key))


OPS = ["delete", "replace", "rename", "move", "add"]


def mutated(original: dict, data) -> dict:
    """A copy of `original` with one to three mutations drawn from `data`."""
    manifest = copy.deepcopy(original)
    for _ in range(data.draw(st.integers(1, 3))):
        manifest = mutate(manifest, data)
    return manifest


def mutate(manifest, data):
    """Delete, replace or rename one node anywhere in the manifest, or replace the whole of it; or change it
    in ways that must not matter: move a key to the end of its object, add a field unknown to this twostep."""
    path, op = data.draw(st.sampled_from(list(paths(manifest)))), data.draw(st.sampled_from(OPS))
    if op == "add" and isinstance(manifest, dict):
        manifest["x-" + data.draw(st.text(max_size=8))] = data.draw(json_values)
        return manifest
    if not path:
        return data.draw(json_values)
    parent = manifest
    for key in path[:-1]:
        parent = parent[key]
    key = path[-1]
    if op == "delete" or (op in ("rename", "move") and isinstance(parent, list)):
        del parent[key]
    elif op in ("replace", "add"):
        parent[key] = data.draw(json_values)
    else:
        parent[data.draw(st.text(max_size=12)) if op == "rename" else key] = parent.pop(key)
    return manifest


@pytest.fixture(scope="module")
def fuzz_art(demo_artifact, tmp_path_factory):
    art = tmp_path_factory.mktemp("fuzz") / "art"
    shutil.copytree(demo_artifact, art)
    return art, json.loads((art / "manifest.json").read_text())


REQUIRED = ("format", "schema_version", "model", "dtype", "max_positions", "opset", "graphs", "files")
RECORDS = ("exporter", "validation")  # how the artifact was made: read by people, relied on by no consumer


def loads_as_written(manifest, original) -> bool:
    """Whether a mutated manifest differs from the original only in its records and in fields this twostep does
    not know (which a newer twostep may add): such a manifest must load."""
    return isinstance(manifest, dict) and all(manifest.get(k) == v for k, v in original.items() if k not in RECORDS)


def refused_for_sure(manifest) -> bool:
    return not isinstance(manifest, dict) or any(key not in manifest for key in REQUIRED)


def test_mutated_manifests_are_loaded_or_refused_with_bad_artifact_only(fuzz_art):
    """250 manifests, each changed 1 to 3 times (mutate): each loads or is refused with BadArtifact, never
    another exception; those changed only in their records and unknown fields load, those missing a required
    field are refused, and over the run each of these happens often."""
    art, original = fuzz_art
    seen = dict.fromkeys(["loaded", "harmless", "refused", "incomplete"], 0)

    @settings(max_examples=250, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
    @given(st.data())
    def prop(data):
        manifest = mutated(original, data)
        (art / "manifest.json").write_text(json.dumps(manifest))
        harmless, incomplete = loads_as_written(manifest, original), refused_for_sure(manifest)
        try:
            artifact = load_artifact(art)
        except BadArtifact:
            assert not harmless, "refused a manifest changed only in its records and unknown fields"
            seen["refused"] += 1
            seen["incomplete"] += incomplete
            return
        assert not incomplete, f"loaded a manifest without one of {REQUIRED}"
        seen["loaded"] += 1
        seen["harmless"] += harmless
        assert artifact.config.max_positions == artifact.manifest.to_json()["max_positions"]

    prop()
    assert seen["loaded"] >= 15 and seen["harmless"] >= 10, seen
    assert seen["refused"] >= 125 and seen["incomplete"] >= 25, seen


def reorder(node):
    """Every object's keys in reverse order."""
    if isinstance(node, dict):
        return {k: reorder(node[k]) for k in reversed(list(node))}
    return [reorder(v) for v in node] if isinstance(node, list) else node


HARMLESS = {
    "keys in reverse order": lambda m: json.dumps(reorder(m)),
    "no whitespace": lambda m: json.dumps(m, separators=(",", ":")),
    "tabs and blank lines": lambda m: "\n\n" + json.dumps(m, indent="\t") + "\n \n",
    "a field from a newer twostep": lambda m: json.dumps({**m, "signed_by": {"key": "abc", "at": 1}}),
}


@pytest.mark.parametrize("change", HARMLESS)
def test_manifests_written_differently_load_the_same(fuzz_art, change):
    art, original = fuzz_art
    (art / "manifest.json").write_text(json.dumps(original))
    expected = load_artifact(art).manifest
    (art / "manifest.json").write_text(HARMLESS[change](copy.deepcopy(original)))
    assert load_artifact(art).manifest == expected


def edit(path, value):
    """A manifest with the node at `path` set to `value` (or deleted, for None)."""
    def change(manifest):
        parent = manifest
        for key in path[:-1]:
            parent = parent[key]
        if value is None:
            del parent[path[-1]]
        else:
            parent[path[-1]] = value
        return manifest
    return change


INVALID = {
    "another format": (edit(("format",), "onnx"), "not a twostep manifest"),
    "a newer schema": (edit(("schema_version",), 99), "schema version 99"),
    "no file list": (edit(("files",), None), "missing 'files'"),
    "a hash changed": (edit(("files", "decoder.onnx"), "0" * 64), "decoder.onnx: sha256 does not match"),
    "a hash malformed": (edit(("files", "decoder.onnx"), "abc"), "sha256 of 'decoder.onnx' is 'abc'"),
    "graph I/O edited": (edit(("graphs", "decoder", "outputs"), []), "inputs/outputs are not those"),
    "max_positions differs": (edit(("max_positions",), 7), "max_positions differs from model.max_positions"),
    "an unknown dtype": (edit(("dtype",), "float64"), "'dtype' is 'float64'"),
    "no model": (edit(("model",), None), "missing 'model'"),
}


@pytest.mark.parametrize("change", INVALID)
def test_invalid_manifests_are_refused_with_what_is_wrong(fuzz_art, change):
    art, original = fuzz_art
    damage, message = INVALID[change]
    (art / "manifest.json").write_text(json.dumps(damage(copy.deepcopy(original))))
    with pytest.raises(BadArtifact) as info:
        load_artifact(art)
    assert message in str(info.value)


@bounded
@given(st.binary(max_size=300) | st.text(max_size=300).map(str.encode))
def test_manifests_that_are_not_json_objects_are_refused(fuzz_art, raw):
    art, _ = fuzz_art
    (art / "manifest.json").write_bytes(raw)
    with pytest.raises(BadArtifact):
        load_artifact(art)


@pytest.mark.slow
def test_cpp_reads_the_same_mutated_manifests_without_crashing(fuzz_art, cpp_build, tmp_path):
    """The C++ reader on manifests mutated the same way: it loads, or says one `error:` line; no abort."""
    art, original = fuzz_art
    seen = []

    @settings(max_examples=30, deadline=None, derandomize=True, database=None)
    @given(st.data())
    def run(data):
        manifest = mutated(original, data)
        (art / "manifest.json").write_text(json.dumps(manifest))
        proc = translate_cpp(cpp_build, art, ["one"])
        assert proc.returncode in (0, 1), proc.stderr[-2000:]
        if proc.returncode == 1:
            assert proc.stderr.startswith("error: ") and proc.stdout == ""
        seen.append(proc.returncode)

    run()
    assert 1 in seen and 0 in seen and len(seen) == 30
