"""A client in another language, written from the .proto files alone: clients/node/generate.js
(@grpc/grpc-js + @grpc/proto-loader) streams the same text as the Python client."""

import json
import shutil
import subprocess

import pytest

from nanoserve.client import Client
from tests.e2e.conftest import REPO_ROOT

pytestmark = pytest.mark.e2e

NODE_CLIENT = REPO_ROOT / "clients" / "node"


@pytest.fixture(scope="module")
def node() -> str:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    if not (NODE_CLIENT / "node_modules" / "@grpc" / "grpc-js").is_dir():
        pytest.skip("clients/node/node_modules is missing: run `npm ci --prefix clients/node`")
    return node


def run_node(node: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [node, str(NODE_CLIENT / "generate.js"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


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
