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
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx", reason="the serving tests need httpx (pip install -e '.[dev]')")
pytest.importorskip("ray.serve", reason="Ray Serve is an optional extra (pip install -e '.[ray]')")

from fault_helpers import POISON_SITE, poison_word  # noqa: E402
from twostep.runtime.translator import open_translator  # noqa: E402

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(proc, log) -> int:
    """SIGTERM a `twostep serve --ray` process and its exit code (its process group killed after 90 s); its log
    closed."""
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(90)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    finally:
        log.close()


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
    word, poison = poison_word(demo_artifact, sentences)  # the replicas' search groups raise on its token
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "RAY_DEDUP_LOGS": "0",  # every replica's log lines, undeduplicated
           "PYTHONPATH": POISON_SITE, "TWOSTEP_TEST_POISON": str(poison)}
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
        with ThreadPoolExecutor(max_workers=16) as pool:  # a poison among them: it fails alone
            texts = sentences[:24] + [f"{sentences[0]} {word}"] * 2 + sentences[24:]
            replies = list(pool.map(lambda s: httpx.post(f"{url}/v1/translate", json={"text": [s]}, headers=auth,
                                                         timeout=120), texts))
        poisoned = replies[24:26]
        replies = replies[:24] + replies[26:]
        assert [r.status_code for r in replies] == [200] * len(sentences)
        assert [r.json()["translations"][0][0]["text"] for r in replies] == want
        assert [r.status_code for r in poisoned] == [500] * 2
        assert all("decoding this request failed" in r.json()["error"] for r in poisoned), poisoned[0].text
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
        code = stop(proc, log)
    assert code == 0, (tmp_path / "serve.log").read_text()[-3000:]
    assert key[:-1] not in (tmp_path / "serve.log").read_text()


@pytest.fixture(scope="module")
def argos_en_de(tmp_path_factory) -> Path:
    """A second Argos package, en -> de, of other weights than argos_artifact's en -> fr (tests/ct2_models.py's
    checkpoint trained from another seed), imported and exported."""
    pytest.importorskip("ctranslate2", reason="the Argos package is built by CTranslate2's converter")
    import ct2_models as build
    from twostep.exporter.export import export
    from twostep.model.sources import import_model

    root = tmp_path_factory.mktemp("argos-en-de")
    ckpt = build.opennmt_py_checkpoint(root / "opennmt_py", seed=2)
    ct2 = build.convert_opennmt_py(ckpt, root / "ct2", quantization="int8")
    package = build.argos_package(ct2, ckpt.parent / "sentencepiece.model", root / "package", "en", "de")
    import_model(package, root / "ckpt")
    export(root / "ckpt", root / "en-de")
    return root / "en-de"


def test_ray_serves_many_models_through_its_model_multiplexing(argos_artifact, argos_en_de, tmp_path):
    """Two models, --max-loaded 1, two replicas: each replica's models are Ray Serve's multiplexing's, which reports
    them to its controller, so that requests naming their model (serve_multiplexed_model_id) go to the replica that
    has it loaded: once each model is on a replica, alternating requests load nothing more. Requests without the
    header are answered too; every answer is the Python runtime's text."""
    sentences = ["the cat sat in the park", "hello dog", "a quick fox", "good dog"]
    want = {}
    for art, target in ((argos_artifact, "fr"), (argos_en_de, "de")):
        translator, backend = open_translator(art)
        with backend:
            want[target] = translator.translate(sentences)
    assert want["fr"] != want["de"], "the two models must answer apart for this test to tell them apart"
    names = {"fr": argos_artifact.name, "de": argos_en_de.name}
    assert names["fr"] != names["de"]
    port = free_port()
    log_path = tmp_path / "serve.log"
    log = open(log_path, "w+")
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "RAY_DEDUP_LOGS": "0"}
    proc = subprocess.Popen([sys.executable, "-m", "twostep.cli", "serve", str(argos_artifact), str(argos_en_de),
                             "--ray", "--port", str(port), "--replicas", "2", "--num-cpus", "0.5", "--max-loaded", "1",
                             "--graceful-shutdown-wait-loop", "0.5"],
                            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"

    def translate(target, header=True):
        r = httpx.post(f"{url}/v1/translate", json={"text": sentences, "src_lang": "en", "tgt_lang": target,
                                                    "split": False},
                       headers={"serve_multiplexed_model_id": names[target]} if header else {}, timeout=60)
        assert r.status_code == 200, r.text
        return [hyps[0]["text"] for hyps in r.json()["translations"]]

    def loads():  # (replica pid, model folder) of each model a replica loaded, in order
        return [(line.split("pid=")[1].split(")")[0], line.split("loaded ")[1].split(" on ")[0].rsplit("/", 1)[1])
                for line in log_path.read_text().splitlines() if "ServeReplica" in line and " loaded /" in line]

    try:
        deadline = time.monotonic() + 240
        while "serving on" not in log_path.read_text():
            assert proc.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.5)
        assert translate("de") == want["de"]  # one replica unloads en -> fr for it
        time.sleep(5)  # Ray's replicas push their model ids every 0.1 s; the proxy learns (slower under load)
        before = loads()
        # both replicas loaded the first model at start; one of them, the second model for that request
        assert sorted(name for _, name in before) == sorted([names["fr"], names["fr"], names["de"]]), \
            log_path.read_text()
        for target in ["fr", "de"] * 6:
            assert translate(target) == want[target]
        time.sleep(1)  # the replicas' log lines reach the driver
        assert loads() == before, "a request naming its model went to a replica without it"
        assert {pid for pid, _ in before} == {pid for pid, _ in loads()}
        assert translate("fr", header=False) == want["fr"] and translate("de", header=False) == want["de"]
    finally:
        code = stop(proc, log)
    assert code == 0, log_path.read_text()[-3000:]
