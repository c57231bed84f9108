"""nanoserve.cli: subcommand dispatch, `generate` against a fake frontend, child process handling."""

import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from nanoserve import cli
from nanoserve.process import Child
from nanoserve.proto.v1 import common_pb2
from nanoserve.proto.v1 import frontend_service_pb2 as frontend_pb2
from nanoserve.proto.v1 import frontend_service_pb2_grpc as frontend_grpc


class EchoFrontend(frontend_grpc.FrontendServiceServicer):
    def __init__(self) -> None:
        self.requests: list = []

    def _reply(self, text: str):
        for piece in (text[:2], text[2:]):
            yield frontend_pb2.GenerateResponse(text=piece, token_ids=[1])
        yield frontend_pb2.GenerateResponse(
            finish_reason=common_pb2.FINISH_REASON_LENGTH,
            usage=common_pb2.Usage(prompt_tokens=3, completion_tokens=2),
        )

    def Generate(self, request, context):
        self.requests.append(request)
        if request.sampling_params.HasField("top_p") and request.sampling_params.top_p == 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "sampling_params.top_p: bad")
        yield from self._reply("<" + request.prompt + ">")

    def Chat(self, request, context):
        self.requests.append(request)
        yield from self._reply("chat:" + request.messages[0].content)


@pytest.fixture
def frontend() -> Iterator[tuple[str, EchoFrontend]]:
    fake = EchoFrontend()
    server = grpc.server(ThreadPoolExecutor(2))
    frontend_grpc.add_FrontendServiceServicer_to_server(fake, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}", fake
    server.stop(0)


def test_generate_streams_to_stdout(frontend, capsys) -> None:
    address, fake = frontend
    code = cli.generate(
        [
            "世界 hi",
            "--address",
            address,
            "--max-tokens",
            "5",
            "--temperature",
            "0",
            "--stop",
            "a",
            "--stop",
            "b",
            "--ignore-eos",
            "--usage",
        ]
    )
    assert code == 0
    out, err = capsys.readouterr()
    assert out == "<世界 hi>\n"
    assert "finish_reason=length prompt_tokens=3 completion_tokens=2" in err
    params = fake.requests[0].sampling_params
    assert (params.max_tokens, params.temperature, list(params.stop), params.ignore_eos) == (
        5,
        0.0,
        ["a", "b"],
        True,
    )
    assert not params.HasField("top_p") and not params.HasField("seed")


def test_generate_chat_and_error(frontend, capsys) -> None:
    address, fake = frontend
    assert cli.generate(["q", "--address", address, "--chat", "--no-thinking"]) == 0
    assert capsys.readouterr().out == "chat:q\n"
    assert fake.requests[0].HasField("enable_thinking") and not fake.requests[0].enable_thinking
    assert cli.generate(["q", "--address", address, "--top-p", "0"]) == 1
    assert "INVALID_ARGUMENT: sampling_params.top_p: bad" in capsys.readouterr().err


def test_pass_through_commands(monkeypatch: pytest.MonkeyPatch) -> None:
    """`nanoserve worker/frontend` run the service's main in this process, named for the usage."""
    import nanoserve.frontend.__main__ as frontend_main
    import nanoserve.frontend.gateway.__main__ as gateway_main
    import nanoserve.worker.__main__ as worker_main

    calls: list = []
    monkeypatch.setattr(worker_main, "main", lambda argv, prog: calls.append((prog, argv)))
    monkeypatch.setattr(frontend_main, "main", lambda argv, prog: calls.append((prog, argv)))
    monkeypatch.setattr(gateway_main, "main", lambda argv, prog: calls.append((prog, argv)))
    cli.main(["worker", "--port", "0", "--device", "cpu"])
    cli.main(["frontend", "--help"])
    cli.main(["gateway", "--port", "0"])
    assert calls == [
        ("nanoserve worker", ["--port", "0", "--device", "cpu"]),
        ("nanoserve frontend", ["--help"]),
        ("nanoserve gateway", ["--port", "0"]),
    ]
    import nanoserve.tiny.model

    monkeypatch.setattr(nanoserve.tiny.model, "main", lambda argv: calls.append(("tiny", argv)))
    cli.main(["make-tiny-model", "/tmp/x", "--shards", "2"])
    assert calls[-1] == ("tiny", ["/tmp/x", "--shards", "2"])
    with pytest.raises(SystemExit):
        cli.main(["no-such-command"])


def test_child_relays_output_and_stops(capsys) -> None:
    script = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\n"
        "print('log line', flush=True)\n"
        "print('frontend listening on 127.0.0.1:4242', flush=True)\n"
        "time.sleep(30)\n"
    )
    child = Child("frontend", [sys.executable, "-c", script])
    assert child.listening.wait(10)
    assert child.address == "127.0.0.1:4242" and child.alive()
    assert child.stop(timeout=10) == 0
    assert "log line" in capsys.readouterr().out


def test_child_killed_when_it_ignores_sigterm() -> None:
    script = (
        "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('worker listening on 127.0.0.1:1', flush=True)\ntime.sleep(30)\n"
    )
    child = Child("worker", [sys.executable, "-c", script])
    assert child.listening.wait(10)
    assert child.stop(timeout=0.5) == -9
