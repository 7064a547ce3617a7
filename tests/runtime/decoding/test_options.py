"""What a decode is asked for (twostep/runtime/decoding/options.py): the special token ids of a model, how its
decoder starts, what it never generates, and a sentence's forced tokens (Entry.prefix)."""

from __future__ import annotations

import numpy as np
import torch

from twostep.model.transformer import Transformer
from twostep.runtime.backends.torch_backend import TorchSession
from twostep.runtime.decoding import DecodeOptions, Specials, decode

SOURCES = [[5, 9, 14, 3], [7, 7, 21, 30, 11, 3], [40, 3]]


def teacher_forced_log_probs(model: Transformer, source: list[int], decoder_input: list[int]) -> np.ndarray:
    """log-softmax of the eager model's logits at every position of `decoder_input`, one sentence alone."""
    ids = torch.tensor([source])
    with torch.no_grad():
        logits = model(ids, torch.ones_like(ids), torch.tensor([decoder_input]))[0]
    return torch.log_softmax(logits.double(), -1).numpy()


def test_specials_of_a_config_carry_its_start_id_and_the_ids_it_never_generates(tiny_model):
    c = tiny_model.config.replace(decoder_start_id=0, never_generate=(0, 7))
    specials = Specials.of(c)
    assert (specials.pad_id, specials.bos_id, specials.eos_id, specials.unk_id) == (0, 0, c.eos_id, c.unk_id)
    assert specials.never == (0, 7)
    assert specials.blocked(suppress_eos=True) == [0, 7, c.eos_id]
    assert Specials.of(tiny_model.config).bos_id == tiny_model.config.bos_id  # no start id: bos


def test_a_forced_prefix_is_fed_one_token_a_step_and_left_out_of_the_hypotheses(tiny_model):
    """Rows with different forced tokens share a batch; each decodes what the eager model's argmax gives after
    [bos, forced...], the forced tokens counted against the limit and left out of the result."""
    c = tiny_model.config
    specials = Specials.of(c)
    prefixes = [(7,), (8, 9), ()]
    hyps = decode(TorchSession(tiny_model), SOURCES, DecodeOptions(), specials=specials, max_new_tokens=10,
                  prefixes=prefixes)
    for source, prefix, (hyp,) in zip(SOURCES, prefixes, hyps):
        tokens = hyp.tokens
        assert len(prefix) + len(tokens) <= 10
        log_probs = teacher_forced_log_probs(tiny_model, source, [c.bos_id, *prefix, *tokens])
        want = log_probs[len(prefix) :].argmax(-1)  # what follows each position from the last forced one on
        assert tokens == want[: len(tokens)].tolist()
        if len(prefix) + len(tokens) < 10:
            assert want[len(tokens)] == c.eos_id  # it stopped at eos, not at the limit
        alone = decode(TorchSession(tiny_model), [source], DecodeOptions(), specials=specials, max_new_tokens=10,
                       prefixes=[prefix])
        assert alone[0][0].tokens == tokens


def test_beam_search_scores_a_forced_token_zero_and_counts_it_in_the_length(tiny_model):
    c = tiny_model.config
    options = DecodeOptions(beam_size=3, n_best=3, length_penalty=1.0)
    hyps = decode(TorchSession(tiny_model), SOURCES[:2], options, specials=Specials.of(c), max_new_tokens=8,
                  prefixes=[(7,), (7,)])
    for source, sentence in zip(SOURCES, hyps):
        assert len(sentence) == 3
        for hyp in sentence:
            ended = len(hyp.tokens) + 1 < 8  # an eos was generated after the forced token and the tokens
            decoder_input = [c.bos_id, 7, *hyp.tokens]
            log_probs = teacher_forced_log_probs(tiny_model, source, decoder_input)
            targets = [*hyp.tokens, c.eos_id] if ended else hyp.tokens
            total = sum(log_probs[1 + i, t] for i, t in enumerate(targets))  # the forced step adds nothing
            length = 1 + len(targets)
            assert abs(hyp.score - total / length) < 1e-4, (hyp, total / length)


def test_ids_a_model_never_generates_are_never_picked(tiny_model):
    c = tiny_model.config
    plain = decode(TorchSession(tiny_model), SOURCES, DecodeOptions(), specials=Specials.of(c), max_new_tokens=6)
    first = {h[0].tokens[0] for h in plain if h[0].tokens}
    never = tuple(sorted(first - {c.eos_id}))
    assert never, "the test needs a first token to forbid"
    specials = Specials.of(c.replace(never_generate=never))
    for options in (DecodeOptions(), DecodeOptions(beam_size=3), DecodeOptions(sampling=True, seed=1)):
        hyps = decode(TorchSession(tiny_model), SOURCES, options, specials=specials, max_new_tokens=6)
        assert all(not set(h.tokens) & set(never) for sentence in hyps for h in sentence)
