"""`twostep serve --ray`: the same app through a real local Ray Serve cluster (on loopback), two replicas."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

httpx = pytest.importorskip("httpx", reason="the serving tests need httpx (pip install -e '.[dev]')")
pytest.importorskip("ray.serve", reason="Ray Serve is an optional extra (pip install -e '.[ray]')")

from twostep.runtime.translator import open_translator  # noqa: E402

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ray_serve_replicas_answer_like_the_python_runtime(demo_artifact, tmp_path):
    from twostep.model.tasks import get_task

    sentences = [source for source, _ in get_task("numbers-en-de").split("test")][:48]
    translator, backend = open_translator(demo_artifact)
    with backend:
        want = [translator.translate([s])[0] for s in sentences]
    port = free_port()
    log = open(tmp_path / "serve.log", "w+")
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "RAY_DEDUP_LOGS": "0"}  # every replica's log lines, undeduplicated
    proc = subprocess.Popen([sys.executable, "-m", "twostep.cli", "serve", str(demo_artifact), "--ray", "--port",
                             str(port), "--replicas", "2", "--num-cpus", "0.5"], stdout=log, stderr=subprocess.STDOUT,
                            env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while "serving on" not in (tmp_path / "serve.log").read_text():
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()
            assert time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
            time.sleep(0.5)
        assert httpx.get(f"{url}/readyz", timeout=30).json()["status"] == "ready"
        with ThreadPoolExecutor(max_workers=16) as pool:
            replies = list(pool.map(lambda s: httpx.post(f"{url}/v1/translate", json={"text": [s]}, timeout=120),
                                    sentences))
        assert [r.status_code for r in replies] == [200] * len(sentences)
        assert [r.json()["translations"][0][0]["text"] for r in replies] == want
        bad = httpx.post(f"{url}/v1/translate", json={"ids": [[5, 999, 3]]}, timeout=30)
        assert bad.status_code == 400 and "outside the vocabulary" in bad.json()["error"]
        text = (tmp_path / "serve.log").read_text()
        replicas = {line.split("pid=")[1].split(")")[0] for line in text.splitlines()
                    if "ServeReplica" in line and "POST /v1/translate 200" in line}
        assert len(replicas) == 2, "requests did not reach both replicas"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(90)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise
        log.close()
    assert code == 0, (tmp_path / "serve.log").read_text()[-3000:]
