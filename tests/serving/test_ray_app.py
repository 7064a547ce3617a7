"""`twostep serve --ray`: the same app through a real local Ray Serve cluster (on loopback), two replicas, with
API keys; the deployment's graceful shutdown options."""

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


def test_the_deployment_carries_ray_serves_graceful_shutdown_options(demo_artifact):
    """app_builder's graceful_shutdown_* keys (and --ray's --graceful-shutdown-*, through `run`) reach the
    deployment; Ray Serve's defaults without them."""
    from twostep.serving import ray_app

    def options(**keys):
        config = ray_app.app_builder({"model_dir": str(demo_artifact), **keys})._bound_deployment._deployment_config
        return config.graceful_shutdown_wait_loop_s, config.graceful_shutdown_timeout_s

    assert options(graceful_shutdown_wait_loop_s="0.5", graceful_shutdown_timeout_s="7") == (0.5, 7.0)
    assert options() == (2.0, 20.0)


def test_ray_serve_replicas_answer_like_the_python_runtime(demo_artifact, tmp_path):
    from twostep.model.tasks import get_task

    sentences = [source for source, _ in get_task("numbers-en-de").split("test")][:48]
    translator, backend = open_translator(demo_artifact)
    with backend:
        want = [translator.translate([s])[0] for s in sentences]
    port = free_port()
    log = open(tmp_path / "serve.log", "w+")
    key = "k3y-ray-0c4f2a9d"
    (tmp_path / "keys").write_text(f"# the replicas get its digest\n{key}\n")
    auth = {"Authorization": f"Bearer {key}"}
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "RAY_DEDUP_LOGS": "0"}  # every replica's log lines, undeduplicated
    proc = subprocess.Popen([sys.executable, "-m", "twostep.cli", "serve", str(demo_artifact), "--ray", "--port",
                             str(port), "--replicas", "2", "--num-cpus", "0.5", "--api-key-file", tmp_path / "keys",
                             "--graceful-shutdown-wait-loop", "0.5", "--graceful-shutdown-timeout", "30"],
                            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while "serving on" not in (tmp_path / "serve.log").read_text():
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()
            assert time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
            time.sleep(0.5)
        assert httpx.get(f"{url}/readyz", timeout=30).json()["status"] == "ready"  # open, as /healthz
        with ThreadPoolExecutor(max_workers=16) as pool:
            replies = list(pool.map(lambda s: httpx.post(f"{url}/v1/translate", json={"text": [s]}, headers=auth,
                                                         timeout=120), sentences))
        assert [r.status_code for r in replies] == [200] * len(sentences)
        assert [r.json()["translations"][0][0]["text"] for r in replies] == want
        bad = httpx.post(f"{url}/v1/translate", json={"ids": [[5, 999, 3]]}, headers=auth, timeout=30)
        assert bad.status_code == 400 and "outside the vocabulary" in bad.json()["error"]
        for headers in ({}, {"Authorization": f"Bearer {key[:-1]}"}):
            refused = httpx.post(f"{url}/v1/translate", json={"text": ["seven"]}, headers=headers, timeout=30)
            assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
        text = (tmp_path / "serve.log").read_text()
        assert key[:-1] not in text
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
    assert key[:-1] not in (tmp_path / "serve.log").read_text()
