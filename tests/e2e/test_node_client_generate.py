"""clients/node/generate.js streams the same text as the Python client, in plaintext and over TLS
with a bearer token (refused without them), and prints logprobs, --n completions and --priority."""

import json
from collections.abc import Iterator

import pytest

from nanoserve.client import Client
from tests.e2e.node_client_process import as_printed, find_node, run_node, universal_newlines
from tests.e2e.processes import Service, start_frontend

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def node() -> str:
    return find_node()


@pytest.mark.parametrize("prompt", ["The capital of France is", "你好世界🙂"])
def test_node_client_streams_the_python_clients_text(node, services, prompt) -> None:
    result = run_node(node, "--address", services.frontend.address, "--max-tokens", "20", prompt)
    assert result.returncode == 0, result.stderr
    with Client(services.frontend.address, timeout=30) as client:
        want = client.generate(prompt, temperature=0, max_tokens=20)
    assert result.stdout == want.text + "\n"


def test_node_client_reports_the_status(node, services) -> None:
    result = run_node(node, "--address", services.frontend.address, "--max-tokens", "0", "hi")
    assert result.returncode == 1
    assert "INVALID_ARGUMENT" in result.stderr and "sampling_params.max_tokens" in result.stderr


TOKEN = "node-client-key-0123456789"


@pytest.fixture(scope="module")
def tls_frontend(node, services, tiny_model_dir, certs) -> Iterator[Service]:
    """TLS and one token, in front of the shared worker."""
    frontend = start_frontend(
        tiny_model_dir,
        services.worker.address,
        "--tls-cert-file", str(certs.server_cert),
        "--tls-key-file", str(certs.server_key),
        "--api-keys", TOKEN,
        wait=False,
    )  # fmt: skip
    try:
        with Client(frontend.wait_listening(), root_certificates=certs.ca) as client:
            client.wait_ready(timeout=90)
    except BaseException:
        frontend.kill()
        raise
    yield frontend
    frontend.stop()


def test_node_client_with_tls_and_a_token(node, tls_frontend, certs) -> None:
    prompt = "The capital of France is"
    with Client(tls_frontend.address, timeout=30, root_certificates=certs.ca, token=TOKEN) as c:
        want = c.generate(prompt, temperature=0, max_tokens=12).text + "\n"
    address = ("--address", tls_frontend.address, "--max-tokens", "12")
    by_flags = run_node(node, *address, "--ca", str(certs.ca), "--token", TOKEN, prompt)
    assert by_flags.returncode == 0, by_flags.stderr
    assert by_flags.stdout == want
    by_env = run_node(
        node, *address, prompt, NANOSERVE_CA_FILE=str(certs.ca), NANOSERVE_TOKEN=TOKEN
    )
    assert by_env.returncode == 0, by_env.stderr
    assert by_env.stdout == want


def test_node_client_without_the_token_or_the_ca_is_refused(node, tls_frontend, certs) -> None:
    address = ("--address", tls_frontend.address, "--max-tokens", "4")
    no_token = run_node(node, *address, "--ca", str(certs.ca), "hi")
    assert no_token.returncode == 1 and "UNAUTHENTICATED" in no_token.stderr
    wrong = run_node(node, *address, "--ca", str(certs.ca), "--token", TOKEN + "x", "hi")
    assert wrong.returncode == 1 and "UNAUTHENTICATED" in wrong.stderr
    plaintext = run_node(node, *address, "--token", TOKEN, "hi")
    assert plaintext.returncode == 1 and "UNAVAILABLE" in plaintext.stderr


def test_node_client_prints_logprobs(node, services) -> None:
    prompt = "The capital of France is"
    args = ["--address", services.frontend.address, "--max-tokens", "6", "--logprobs", "2", prompt]
    result = run_node(node, *args)
    assert result.returncode == 0, result.stderr
    with Client(services.frontend.address, timeout=30) as client:
        want = client.generate(prompt, temperature=0, max_tokens=6, logprobs=2)
    assert want.logprobs is not None
    lines = [line.split("\t") for line in result.stderr.splitlines()]
    assert [int(line[0]) for line in lines] == want.token_ids
    for line, entry in zip(lines, want.logprobs, strict=True):
        assert abs(float(line[1]) - entry.logprob) < 1e-3
        assert json.loads(line[2]) == entry.text and line[3].count('"=') == 2


def test_node_client_n_and_priority(node, services) -> None:
    """--n prints each completion prefixed by its index (seeded: the Python client's same four);
    --priority reaches the request (an invalid one is refused naming the field)."""
    prompt = "Once upon a time"
    address = ("--address", services.frontend.address, "--max-tokens", "10")
    seeded = run_node(node, *address, "--temperature", "1", "--seed", "7", "--n", "4", prompt)
    assert seeded.returncode == 0, seeded.stderr
    with Client(services.frontend.address, timeout=30) as client:
        want = client.generate(prompt, temperature=1.0, seed=7, max_tokens=10, n=4)
        greedy = client.generate(prompt, temperature=0, max_tokens=10, priority=-3)
    assert len({c.text for c in want.choices}) == 4  # distinct: the prefixes are what differ
    assert seeded.stdout == as_printed(want.choices)
    urgent = run_node(node, *address, "--priority", "-3", prompt)
    assert urgent.returncode == 0, urgent.stderr
    assert urgent.stdout == universal_newlines(greedy.text + "\n")
    bad = run_node(node, *address, "--n", "0", prompt)
    assert bad.returncode == 2 and "--n must be a positive integer" in bad.stderr
