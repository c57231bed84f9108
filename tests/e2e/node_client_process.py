"""clients/node/generate.js as a process for the e2e tests: find node (or skip), run the client, a
stand-in FrontendService to call, the tools and schemas the tests send, and the text the client
prints for a Python client's completion."""

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager

import pytest

from tests.e2e.processes import REPO_ROOT

NODE_CLIENT = REPO_ROOT / "clients" / "node"


def find_node() -> str:
    """The node binary, or skip the test: node or clients/node/node_modules is missing."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    if not (NODE_CLIENT / "node_modules" / "@grpc" / "grpc-js").is_dir():
        pytest.skip("clients/node/node_modules is missing: run `npm ci --prefix clients/node`")
    return node


def run_node(node: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [node, str(NODE_CLIENT / "generate.js"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={k: v for k, v in os.environ.items() if not k.startswith("NANOSERVE_")} | env,
    )


AGE = {
    "type": "object",
    "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 120}},
    "required": ["age"],
    "additionalProperties": False,
}


@contextmanager
def stand_in(servicer) -> Iterator[str]:
    """A FrontendService servicer served on a free loopback port: yields its address."""
    import grpc

    from nanoserve.proto.v1 import frontend_service_pb2_grpc as pb_grpc

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_FrontendServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(None)


def compact(value: dict) -> str:
    """JSON as JavaScript's JSON.stringify writes it."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def universal_newlines(text: str) -> str:
    """What run_node's text mode reads back for `text` (random weights write \\r too)."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def as_printed(choices) -> str:
    """The --n output: each completion prefixed by its index."""
    return universal_newlines("".join(f"[{i}] {c.text}\n" for i, c in enumerate(choices)))
