"""What a decode is asked for (twostep/runtime/decoding/options.py): the special token ids of a model."""

from __future__ import annotations

import pytest

from twostep.runtime.backends.torch_backend import TorchSession


def test_specials_of_a_config_are_its_ids_and_a_forced_prefix_is_refused_not_ignored(tiny_model):
    from twostep.runtime.decoding import RunningBatch, Specials

    c = tiny_model.config
    specials = Specials.of(c)
    assert (specials.pad_id, specials.bos_id, specials.eos_id, specials.unk_id) == (c.pad_id, c.bos_id, c.eos_id,
                                                                                  c.unk_id)
    assert specials.prefix == ()  # no model forces tokens after bos today
    with pytest.raises(ValueError, match="prefix"):
        RunningBatch(TorchSession(tiny_model), specials=Specials(0, 2, 3, 1, prefix=(7,)))
