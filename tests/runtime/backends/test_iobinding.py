"""The IO-binding step session (twostep/runtime/backends/iobinding.py)."""

from __future__ import annotations

from twostep.artifact import load_artifact


def test_io_binding_session_decodes_like_the_host_session(demo_artifact):
    """ort-cuda's session (OrtValues bound in place, device-side beam reorder) run on the CPU provider."""
    from search import SPECIALS, beam_search, greedy
    from twostep.runtime.backends.iobinding import IoBindingSession
    from twostep.runtime.backends.ort import OrtBackend

    sources = [[5, 9, 13, 7, 3], [11, 3], [8, 8, 21, 33, 40, 12, 6, 3]]
    common = dict(specials=SPECIALS, max_new_tokens=12)
    with OrtBackend(load_artifact(demo_artifact)) as backend:
        bound, host = IoBindingSession(backend, "cpu"), backend.session()
        assert greedy(bound, sources, **common) == greedy(host, sources, **common)
        a = beam_search(bound, sources, beam_size=4, n_best=2, **common)
        b = beam_search(host, sources, beam_size=4, n_best=2, **common)
    assert [[h.tokens for h in x] for x in a] == [[h.tokens for h in x] for x in b]
