"""`twostep serve --api-key-file` / TWOSTEP_API_KEYS: /v1/translate (and /metrics with --protect-metrics) needs
`Authorization: Bearer KEY`, /healthz and /readyz stay open, no key reaches the log; a bad key file stops the
server before it starts. A real server, and the app a Ray replica builds."""

from __future__ import annotations

import pickle

import pytest

httpx = pytest.importorskip("httpx", reason="the serving tests need httpx (pip install -e '.[dev]')")
pytest.importorskip("fastapi", reason="serving needs its extra (pip install -e '.[serve]')")

from cli_helpers import assert_user_error  # noqa: E402
from serving_helpers import post, refused_start, server  # noqa: E402

pytestmark = pytest.mark.slow

KEYS = ("k3y-alpha-7f9c2e51", "k3y-beta-41d0aa93")
WRONG = "n0t-a-key-5e1b77c0"


@pytest.fixture(scope="module")
def key_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("keys") / "keys.txt"
    path.write_text(f"# twostep's keys\n\n  {KEYS[0]}  \n# retired: {WRONG}\n{KEYS[1]}\n")
    return path


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def assert_no_key_in(log: str) -> None:
    for secret in (*KEYS, WRONG, KEYS[0][:-1]):
        assert secret not in log


def test_translate_and_protected_metrics_need_a_key_that_never_reaches_the_log(demo_artifact, key_file):
    refusals = [{}, bearer(WRONG), bearer(KEYS[0][:-1]), bearer(KEYS[0] + "0"), {"Authorization": f"Basic {KEYS[0]}"},
                {"Authorization": KEYS[0]}, {"Authorization": "Bearer"}]
    with server(demo_artifact, "--api-key-file", key_file, "--protect-metrics") as (url, proc):
        for headers in refusals:
            r = post(url, {"text": ["seven"]}, headers=headers)
            assert r.status_code == 401, headers
            assert r.headers["www-authenticate"] == "Bearer"
            assert "Authorization: Bearer KEY" in r.json()["error"]
            assert httpx.get(f"{url}/metrics", headers=headers).status_code == 401
        for headers in (bearer(KEYS[0]), bearer(KEYS[1]), {"Authorization": f"bearer {KEYS[1]}"}):
            r = post(url, {"text": ["seven"]}, headers=headers)
            assert r.status_code == 200, r.text
            assert r.json()["translations"][0][0]["text"]
        # refused before the body is read: bad JSON without a key is a 401, not a 400
        r = httpx.post(f"{url}/v1/translate", content=b"{not json", headers={"content-type": "application/json"})
        assert r.status_code == 401
        assert httpx.get(f"{url}/healthz").status_code == 200
        assert httpx.get(f"{url}/readyz").status_code == 200
        metrics = httpx.get(f"{url}/metrics", headers=bearer(KEYS[1]))
        assert metrics.status_code == 200
        assert f'twostep_requests_total{{api="v1",status="401"}} {len(refusals) + 1}.0' in metrics.text
        assert 'twostep_requests_total{api="v1",status="200"} 3.0' in metrics.text
    log = "".join(proc.log)
    assert "POST /v1/translate 401" in log and "POST /v1/translate 200" in log and "GET /metrics 401" in log
    assert_no_key_in(log)


def test_keys_from_the_environment_and_metrics_open_without_protect_metrics(demo_artifact):
    with server(demo_artifact, env={"TWOSTEP_API_KEYS": f" {KEYS[0]} ,{KEYS[1]}"}) as (url, proc):
        assert post(url, {"text": ["seven"]}).status_code == 401
        assert post(url, {"text": ["seven"]}, headers=bearer(WRONG)).status_code == 401
        assert post(url, {"text": ["seven"]}, headers=bearer(KEYS[1])).status_code == 200
        assert httpx.get(f"{url}/metrics").status_code == 200
    assert_no_key_in("".join(proc.log))


@pytest.mark.parametrize("case", ["absent", "directory", "comments only", "not utf-8", "empty variable",
                                  "protect without keys"])
def test_a_bad_key_file_or_variable_is_one_error_before_the_server_starts(demo_artifact, tmp_path, monkeypatch,
                                                                           case):
    path = tmp_path / "keys.txt"
    args = ["--api-key-file", path]
    if case == "directory":
        path.mkdir()
    elif case == "comments only":
        path.write_text(f"# {WRONG}\n\n   \n")
    elif case == "not utf-8":
        path.write_bytes(b"\xff" + WRONG.encode() + b"\n")
    elif case == "empty variable":
        monkeypatch.setenv("TWOSTEP_API_KEYS", " , ")
        args = []
    elif case == "protect without keys":
        args = ["--protect-metrics"]
    message = {"absent": "No such file", "directory": "Is a directory", "comments only": "holds no key",
               "not utf-8": "not UTF-8", "empty variable": "TWOSTEP_API_KEYS is set but holds no key",
               "protect without keys": "needs API keys"}[case]
    result = refused_start(demo_artifact, *args)
    assert_user_error(result, message)
    assert "Uvicorn running" not in result.stdout + result.stderr
    assert WRONG not in result.stderr


def test_the_ray_app_carries_key_digests_and_its_replicas_check_them(demo_artifact, key_file):
    """What `serve run twostep.serving.ray_app:app_builder api_key_file=...` sends to replicas holds no key, and
    the app a replica builds from it refuses requests without one."""
    cloudpickle = pytest.importorskip("ray.cloudpickle", reason="Ray Serve is an optional extra")
    from fastapi.testclient import TestClient

    from twostep.serving import ray_app
    from twostep.serving.http import build_app

    args = {"model_dir": str(demo_artifact), "api_key_file": str(key_file), "protect_metrics": "true"}
    config = ray_app.serve_config(args)
    replica_class = ray_app.app_builder(args)._bound_deployment.func_or_class
    shipped = repr(config).encode() + pickle.dumps(config) + cloudpickle.dumps(replica_class)
    assert len(config.api_key_digests) == 2 and config.api_key_digests[0] in shipped  # the config does travel
    assert not any(key.encode() in shipped for key in KEYS)
    with TestClient(build_app(config)) as client:
        assert client.post("/v1/translate", json={"text": ["seven"]}).status_code == 401
        assert client.post("/v1/translate", json={"text": ["seven"]}, headers=bearer(KEYS[0])).status_code == 200
        assert client.get("/metrics").status_code == 401
        assert client.get("/readyz").status_code == 200


def test_the_open_paths_are_the_listed_ones_and_the_download_folder():
    """On a server with keys: the page (/ alone, not every path under it), LibreTranslate's open paths and what is
    under /download_file/ need no key; everything else does."""
    from twostep.serving.http import OPEN_PATHS
    from twostep.serving.middleware import is_open

    assert all(is_open(path, OPEN_PATHS) for path in ("/", "/languages", "/suggest", "/download_file/a.b_fr.txt"))
    assert not any(is_open(path, OPEN_PATHS) for path in ("/v1/translate", "/translate", "/metrics", "/download_file",
                                                          "/v1/languages", "/x/"))
