"""`nanoserve serve --gateway-port 0`: worker, frontend and the OpenAI gateway as serve's children;
the printed URL answers the openai SDK, and SIGTERM stops all three, exit 0."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from tests.e2e.processes import descendant_pids, pid_running, start_serve

openai = pytest.importorskip("openai", reason="pip install openai (the dev extra)")
pytestmark = pytest.mark.e2e
OPENAI_LINE = re.compile(r"openai: (?P<url>http://\S+/v1) \(the gateway\)")


def test_serve_runs_the_gateway_in_front_of_its_frontend(tiny_model_dir: Path) -> None:
    serve = start_serve(tiny_model_dir, "--gateway-port", "0")
    children: list[int] = []
    try:
        serve.wait_listening()
        children = descendant_pids(serve.pid)
        deadline = time.monotonic() + 10  # printed with the serving line, read a moment later
        while not (found := OPENAI_LINE.search(serve.output(last=200))):
            assert time.monotonic() < deadline, serve.output()
            time.sleep(0.05)
        client = openai.OpenAI(base_url=found["url"], api_key="unused", max_retries=0)
        (model,) = client.models.list().data
        reply = client.chat.completions.create(
            model=model.id,
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=4,
            temperature=0,
        )
        assert reply.usage is not None and reply.usage.completion_tokens == 4
        assert serve.stop() == 0, serve.output()
        deadline = time.monotonic() + 10  # the gateway's body-parse workers follow it out
        while any(pid_running(pid) for pid in children) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [pid for pid in children if pid_running(pid)]
    finally:
        if serve.alive():
            serve.kill()


def test_serve_runs_several_frontends_and_gateways_on_the_same_ports(tiny_model_dir: Path) -> None:
    """Issue 29: `--frontend-processes 2` starts two frontends sharing --port and two gateways
    sharing --gateway-port (SO_REUSEPORT); connections land on both and every call is served."""
    from nanoserve.client import Client
    from tests.e2e.processes import cmdline

    serve = start_serve(tiny_model_dir, "--gateway-port", "0", "--frontend-processes", "2")
    try:
        address = serve.wait_listening()
        deadline = time.monotonic() + 10
        while not (found := OPENAI_LINE.search(serve.output(last=200))):
            assert time.monotonic() < deadline, serve.output()
            time.sleep(0.05)
        kinds = [cmdline(p) for p in descendant_pids(serve.pid)]
        assert sum("-m nanoserve.frontend.gateway" in c for c in kinds) == 2, kinds
        assert sum("-m nanoserve.frontend " in c + " " for c in kinds) == 2, kinds
        for _ in range(8):  # a connection each: the kernel spreads them over both frontends
            with Client(address, timeout=30) as client:
                assert client.generate("Hi", max_tokens=2).usage.completion_tokens == 2
        sdk = openai.OpenAI(base_url=found["url"], api_key="unused", max_retries=0)
        for _ in range(4):
            done = sdk.completions.create(model=sdk.models.list().data[0].id, prompt="Hi")
            assert done.usage is not None and done.usage.completion_tokens == 16  # the default
        assert serve.stop() == 0, serve.output()
    finally:
        if serve.alive():
            serve.kill()
