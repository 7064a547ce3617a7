"""The API document (/openapi.json, and LibreTranslate's /spec, which answers it) tells the truth, on a real
`twostep serve`: each decoding option's range is the server's (BOUNDS, narrowed by its flags and its model),
LibreTranslate's request bodies are stated, every error is documented as {"error": ...}. And schemathesis, driving
both APIs from that document with a fixed seed, finds no server error, no answer the document does not describe,
and no operation that refuses what the document calls valid (its "schema validation mismatch" warning)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

httpx = pytest.importorskip("httpx", reason="the serving tests need httpx (pip install -e '.[dev]')")
pytest.importorskip("fastapi", reason="serving needs its extra (pip install -e '.[serve]')")
pytest.importorskip("schemathesis", reason="the fuzzing test drives schemathesis' CLI (pip install -e '.[dev]')")

from serving_helpers import server  # noqa: E402
from twostep.artifact import load_artifact  # noqa: E402
from twostep.runtime.decoding.options import BOUNDS  # noqa: E402

pytestmark = pytest.mark.slow

# the server's own limits, below BOUNDS and the defaults: the document must state these
MAX_BEAM, MAX_NEW_TOKENS, MAX_SENTENCES, MAX_CHARS = 4, 40, 8, 2000
# schemathesis' checks of what the server answers (`schemathesis run --help`). Not its checks of what it accepts:
# positive_data_acceptance (a schema-valid request answered 2xx) cannot hold where validity spans fields that JSON
# Schema leaves to the server (n_best at most the beam, sampling without a beam, ids ending with eos, the
# request's total characters and work), and negative_data_rejection (a schema-invalid one refused) cannot where
# LibreTranslate's API takes more than it documents, as LibreTranslate does (alternatives below 0 read as 0, a
# float as its integer part, any api_key on a server without keys). Its warning for an operation that refuses all
# the valid data it was sent is the check of those: it fails the run.
CHECKS = ["not_a_server_error", "status_code_conformance", "content_type_conformance", "response_headers_conformance",
          "response_schema_conformance", "unsupported_method", "allow_header_conformance"]
EXAMPLES, SEED = 300, 1  # at most, per operation and phase: about 1,600 requests, 45 s on 2 cores (AMD EPYC)
# the run's bound (a loaded run passed 75 s beside the other worker); the server's start and the export come before it
TIMEOUT_S = 150


@pytest.fixture(scope="module")
def documented(demo_artifact, tmp_path_factory):
    suggestions = tmp_path_factory.mktemp("suggestions") / "suggestions.db"
    with server(demo_artifact, "--max-beam", MAX_BEAM, "--max-new-tokens", MAX_NEW_TOKENS, "--max-sentences",
                MAX_SENTENCES, "--max-chars", MAX_CHARS, "--suggestions", "--suggestions-db", suggestions) as served:
        url, proc = served
        yield url, proc


def field(properties: dict, name: str) -> dict:
    """A request field's schema where it is given: pydantic's Optional[X] is anyOf [X, null]."""
    return next(branch for branch in properties[name].get("anyOf", [properties[name]]) if branch.get("type") != "null")


def test_the_document_states_the_servers_ranges_bodies_and_errors(documented, demo_artifact):
    url, _ = documented
    document = httpx.get(f"{url}/openapi.json", timeout=30).json()
    assert httpx.get(f"{url}/spec", timeout=30).json() == document
    fields = document["components"]["schemas"]["TranslateRequest"]["properties"]
    tighter = {"beam_size": MAX_BEAM, "n_best": MAX_BEAM, "max_new_tokens": MAX_NEW_TOKENS}
    for name, bound in BOUNDS.items():
        low = {"exclusiveMinimum" if bound.low_open else "minimum": bound.low}
        assert field(fields, {"beam_size": "beam"}.get(name, name)) == {
            "type": "integer" if bound.integer else "number", **low, "maximum": tighter.get(name, bound.high)}, name
    config = load_artifact(demo_artifact, check_hashes=False).config
    assert field(fields, "text") == {"type": "array", "maxItems": MAX_SENTENCES,
                                     "items": {"type": "string", "pattern": r"\S", "maxLength": MAX_CHARS}}
    assert field(fields, "ids")["items"] == {"type": "array", "minItems": 1, "maxItems": config.max_positions,
                                             "items": {"type": "integer", "minimum": 0,
                                                       "maximum": config.src_vocab_size - 1}}
    assert fields["src_lang"]["anyOf"] == fields["tgt_lang"]["anyOf"] == [{"type": "null"}]  # the demo names none
    # LibreTranslate's bodies, which its routes parse themselves: JSON, and forms of one text
    body = document["paths"]["/translate"]["post"]["requestBody"]["content"]
    assert set(body) == {"application/json", "application/x-www-form-urlencoded", "multipart/form-data"}
    assert body["application/json"]["schema"]["required"] == ["q", "source", "target"]
    q = body["application/json"]["schema"]["properties"]["q"]["anyOf"]
    assert q[1]["maxItems"] == MAX_SENTENCES and q[0]["maxLength"] == MAX_CHARS
    assert body["multipart/form-data"]["schema"]["properties"]["q"] == q[0]
    assert body["application/x-www-form-urlencoded"]["schema"]["properties"]["alternatives"]["maximum"] == \
        MAX_BEAM - 1  # a translation and its alternatives are one beam's best
    assert set(document["paths"]["/detect"]["post"]["requestBody"]["content"]["application/json"]["schema"][
        "properties"]) == {"q", "api_key"}
    # every error is {"error": ...}, a 500 (a bug) on every operation too; FastAPI's 422 is never answered
    assert document["components"]["schemas"]["Error"]["properties"] == {"error": {
        "type": "string", "title": "Error", "description": "What went wrong, and what to do about it."}}
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            responses = operation["responses"]
            assert "422" not in responses, (method, path)
            errors = {status: r["content"]["application/json"]["schema"] for status, r in responses.items()
                      if int(status) >= 400}
            assert "500" in errors and set(map(json.dumps, errors.values())) == \
                {json.dumps({"$ref": "#/components/schemas/Error"})}, (method, path, errors)
    assert "HTTPValidationError" not in document["components"]["schemas"]


def test_schemathesis_finds_no_server_error_and_no_validation_mismatch(documented, tmp_path):
    url, proc = documented
    config = tmp_path / "schemathesis.toml"  # named, so that none above the working directory is read
    # files: random bytes are no file of the format their random name says, and a random name (or glossary id) no
    # file (glossary) the server made; their answers are still checked, the warnings that they refuse such data are
    # not
    config.write_text('[cache]\nenabled = false\n\n[warnings]\nfail-on = ["validation_mismatch"]\n\n'
                      '[[operations]]\ninclude-path = ["/translate_file", "/download_file/{name}", '
                      '"/v1/glossaries/{glossary_id}", "/v1/glossaries/{glossary_id}/entries"]\nwarnings = false\n')
    report = tmp_path / "report.json"
    command = [sys.executable, "-m", "schemathesis.cli", "--config-file", str(config), "--no-color", "run",
               f"{url}/openapi.json", "--url", url, "--seed", str(SEED), "--max-examples", str(EXAMPLES),
               "--phases", "examples,coverage,fuzzing", "--checks", ",".join(CHECKS), "--workers", "1",
               "--request-timeout", "30", "--max-redirects", "0", "--generation-database", "none",
               "--report", "json", "--report-json-path", str(report)]
    started = time.monotonic()
    try:  # in tmp_path: schemathesis' files (crashes, caches) stay there
        run = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"schemathesis ran past {TIMEOUT_S} s:\n{exc.stdout}")
    seconds = time.monotonic() - started
    assert report.is_file(), run.stdout + run.stderr
    found = json.loads(report.read_text())
    summary = {key: found[key] for key in ("operations", "test_cases", "failures", "errors")}
    print(f"schemathesis: {seconds:.1f} s, {json.dumps(summary)}")  # for `pytest -s`: what the run did
    assert found["failures"] == [] and found["errors"] == [], run.stdout
    assert {kind: labels for kind, labels in found["warnings"].items() if labels} == {}, run.stdout
    assert run.returncode == 0 and found["complete"], run.stdout + run.stderr
    operations = found["operations"]
    assert operations["tested"] == operations["total"] >= 11 and operations["errored"] == 0, operations
    for label in ("POST /v1/translate", "GET /v1/languages", "POST /translate", "POST /detect", "GET /languages",
                  "GET /frontend/settings", "GET /health", "GET /spec",
                  "POST /suggest"):  # both APIs, each served valid data
        assert any(rate["accepted"] for rate in found["valid_rates"][label].values()), (label, found["valid_rates"])
    assert "Traceback" not in "".join(proc.log)


def test_frontend_settings_say_whether_suggestions_are_taken(documented):
    """This server runs with --suggestions (the many-model server's test sees them off by default)."""
    url, _ = documented
    assert httpx.get(f"{url}/frontend/settings", timeout=30).json()["suggestions"] is True
