"""`nanoserve generate`, `tokenize` and `detokenize` as subprocesses against the real services: n
completions labelled by index, a JSON Schema's output, a logit bias that forces a token, a refusal
printed as its gRPC code; and a `nanoserve serve` with TLS and api keys whose "try:" hint works as
printed once the token is set, and fails UNAUTHENTICATED without it.
"""

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from nanoserve.client import Client
from tests.e2e.processes import REPO_ROOT, start_serve
from tests.tls_certs import make_certs

pytestmark = pytest.mark.e2e
NANOSERVE = [sys.executable, "-m", "nanoserve.cli"]  # `nanoserve` of this interpreter
TOKEN = "cli-test-key-0123456789"
SCHEMA = {
    "type": "object",
    "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 120}},
    "required": ["age"],
    "additionalProperties": False,
}


def nanoserve(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*NANOSERVE, *argv],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def test_n_completions_are_labelled_by_index(services) -> None:
    address = services.frontend.address
    sampling = ("--temperature", "1", "--seed", "5", "--max-tokens", "4")
    done = nanoserve("generate", "--address", address, "--n", "2", *sampling, "Once upon")
    assert done.returncode == 0, done.stderr
    with Client(address, timeout=60) as client:  # seeded: the same two completions
        want = client.generate("Once upon", n=2, temperature=1, seed=5, max_tokens=4).choices
    assert done.stdout == f"[0] {want[0].text}\n[1] {want[1].text}\n"


def test_json_schema_output_parses_and_validates(services, tmp_path: Path) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    pytest.importorskip("xgrammar")
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(SCHEMA))
    done = nanoserve(
        "generate", "--address", services.frontend.address, "--json-schema", f"@{schema}",
        "--temperature", "1", "--seed", "1", "--max-tokens", "64", "--usage", "An age as JSON:",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    jsonschema.validate(json.loads(done.stdout), SCHEMA)
    assert "finish_reason=stop" in done.stderr


def test_logit_bias_forces_a_token_and_the_ids_round_trip(services) -> None:
    address = ("--address", services.frontend.address)
    tokenized = nanoserve("tokenize", *address, " wave")
    assert tokenized.returncode == 0, tokenized.stderr
    (wave,) = tokenized.stdout.split()
    done = nanoserve(
        "generate", *address, "--logit-bias", f"{wave}=100", "--temperature", "1", "--seed", "2",
        "--max-tokens", "3", "--ignore-eos", "--logprobs", "2", "--json", "The sea is",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.splitlines()
    completion = json.loads(line)
    assert completion["token_ids"] == [int(wave)] * 3 and completion["text"] == " wave" * 3
    assert [len(entry["top_logprobs"]) for entry in completion["logprobs"]] == [2, 2, 2]
    detokenized = nanoserve("detokenize", *address, wave, wave)
    assert detokenized.returncode == 0 and detokenized.stdout == " wave wave\n"


def test_a_refusal_prints_its_code_and_field(services) -> None:
    done = nanoserve("generate", "--address", services.frontend.address, "--max-tokens", "0", "x")
    assert done.returncode == 1
    assert done.stderr.startswith("error: INVALID_ARGUMENT: sampling_params.max_tokens")
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("tls_from", ["flags", "environment"])
def test_serve_with_tls_and_api_keys_hints_a_working_command(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tls_from: str
) -> None:
    """The keys come through the environment, as docs/operations.md advises, and the TLS files
    through flags or the environment: serve's readiness probe and its hint see both."""
    certs = make_certs(tmp_path / "certs")
    monkeypatch.setenv("NANOSERVE_FRONTEND_API_KEYS", TOKEN)
    tls = ("--tls-cert-file", str(certs.server_cert), "--tls-key-file", str(certs.server_key))
    if tls_from == "environment":
        monkeypatch.setenv("NANOSERVE_FRONTEND_TLS_CERT_FILE", str(certs.server_cert))
        monkeypatch.setenv("NANOSERVE_FRONTEND_TLS_KEY_FILE", str(certs.server_key))
        tls = ()
    serve = start_serve(tiny_model_dir, *tls)
    try:
        serve.wait_listening()
        hint = re.search(r"try:  (.*)", serve.output())
        assert hint, serve.output()
        env, command, *argv = shlex.split(hint.group(1))
        assert (env, command) == ("NANOSERVE_TOKEN=KEY", "nanoserve")
        assert argv[argv.index("--tls-ca-file") + 1] == str(certs.server_cert)
        assert TOKEN not in serve.output()
        argv.insert(1, "--max-tokens=3")  # after `generate`: a short reply
        done = nanoserve(*argv, env={"NANOSERVE_TOKEN": TOKEN})
        assert done.returncode == 0 and done.stdout.strip(), done.stderr
        refused = nanoserve(*argv, env={"NANOSERVE_TOKEN": ""})
        assert refused.returncode == 1
        assert refused.stderr.startswith("error: UNAUTHENTICATED: missing or unknown bearer token")
        tls = argv[argv.index("--address") : argv.index("--address") + 4]  # address, CA
        tokenized = nanoserve("tokenize", *tls, "--token", TOKEN, "hi")
        assert tokenized.returncode == 0 and tokenized.stdout.split(), tokenized.stderr
    finally:
        serve.stop()
