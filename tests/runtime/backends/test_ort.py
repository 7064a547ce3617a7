"""ONNX Runtime backends (twostep/runtime/backends/ort.py): their sessions' thread pools."""

from __future__ import annotations

from twostep.artifact import load_artifact


def test_pool_threads_spin_within_a_run_and_stop_when_it_returns(tiny_artifact):
    """Threads spinning after a run took the cores from what came next (the encoder's, after a join, from the
    decoder's steps: docs/benchmarks.md, "In-flight vs static batching"); within a run they spin (turning
    that off made a short request alone 1.4x slower)."""
    from twostep.runtime.backends.ort import OrtBackend

    def config(session, key: str) -> str:
        try:
            return session.get_session_options().get_session_config_entry(key)
        except RuntimeError:  # not set: ONNX Runtime's default
            return "default"

    for spin, want in ((False, "1"), (True, "default")):
        backend_class = type("Backend", (OrtBackend,), {"spin_between_runs": spin})
        with backend_class(load_artifact(tiny_artifact[0]), threads=2) as backend:
            assert set(backend.sessions) == {"encoder", "decoder"}
            for graph, session in backend.sessions.items():
                assert config(session, "session.force_spinning_stop") == want, (graph, spin)
                assert config(session, "session.intra_op.allow_spinning") == "default", graph
