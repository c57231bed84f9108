"""`nanoserve generate`, `tokenize` and `detokenize`: flags -> Client and call keywords (parse), and
what they print against a scripted in-process frontend (n > 1, logprobs, --json, tool calls,
reasoning, refusals); `nanoserve serve`'s hint for a frontend with TLS and api keys."""

import argparse
import json
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from nanoserve import cli
from nanoserve.cli.generate_args import SAMPLING_FLAGS, STRUCTURED_OUTPUT, parse
from nanoserve.client.args import Connection
from nanoserve.proto.v1 import common_pb2
from nanoserve.proto.v1 import frontend_service_pb2 as frontend_pb2
from nanoserve.proto.v1 import frontend_service_pb2_grpc as frontend_grpc
from nanoserve.structured_output import KINDS

TOKEN = "a-test-key-0123"
TOOLS = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]


def test_sampling_flags_are_sampling_params_fields() -> None:
    fields = set(common_pb2.SamplingParams.DESCRIPTOR.fields_by_name)
    assert {f.name for f in SAMPLING_FLAGS} <= fields
    assert set(STRUCTURED_OUTPUT) == set(KINDS)


def test_flags_become_call_keywords(tmp_path: Path) -> None:
    schema = tmp_path / "schema.json"
    schema.write_text('{"type": "object"}')
    args = parse(
        [
            "hi",
            *("--n", "2", "--logprobs", "3", "--priority", "-1", "--seed", "7"),
            *(
                "--stream-interval",
                "4",
            ),
            *("--logit-bias", "5=100", "--logit-bias", "9=-2.5", "--logit-bias", "5=1"),
            *("--allowed-token-ids", "1,2", "--allowed-token-ids", "3"),
            *("--json-schema", f"@{schema}", "--stop", "x"),
        ]
    )
    assert not args.chat and args.prompt == "hi"
    assert args.call == {
        "n": 2,
        "logprobs": 3,
        "seed": 7,
        "stop": ["x"],
        "logit_bias": {5: 1.0, 9: -2.5},  # a repeated id: the last one
        "allowed_token_ids": [1, 2, 3],
        "structured_output": {"json_schema": '{"type": "object"}'},
        "priority": -1,
        "stream_interval": 4,
    }
    assert parse(["hi", "--json-object"]).call == {"structured_output": {"json_object": True}}
    assert parse(["hi", "--regex", "a+"]).call == {"structured_output": {"regex": "a+"}}
    assert parse(["hi", "--no-detokenize", "--json"]).call == {"detokenize": False}  # ids only
    assert parse(["hi", "--prompt-token-ids"]).call == {"return_prompt_token_ids": True}


def test_chat_flags(tmp_path: Path) -> None:
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps(TOOLS))
    args = parse(
        ["q", "--chat", "--no-thinking", "--tools", f"@{tools}", "--tool-choice", "required"]
        + ["--tool-function", "weather", "--no-parallel-tool-calls", "--separate-reasoning"]
    )
    assert args.chat and args.call == {
        "enable_thinking": False,
        "tools": TOOLS,
        "tool_choice": "required",
        "tool_choice_function": "weather",
        "parallel_tool_calls": False,
        "separate_reasoning": True,
    }
    assert parse(["q", "--chat"]).call == {"enable_thinking": None}


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--logit-bias", "5"], "expected ID=BIAS"),
        (["--logit-bias", "x=1"], "expected ID=BIAS"),
        (["--allowed-token-ids", "1,-2"], "not a token id"),
        (["--n", "two"], "invalid int value"),
        (["--json-schema", "@/no/such/file"], "cannot read /no/such/file"),
        (["--regex", "a", "--grammar", "b"], "not allowed with argument"),
        (["--tools", "[]"], "--tools needs --chat"),
        (["--tools", "{}", "--chat"], "expected a JSON list of tools"),
        (["--separate-reasoning"], "--separate-reasoning needs --chat"),
        (["--tool-function", "f"], "--tool-function needs --chat"),
        (["--no-parallel-tool-calls"], "--parallel-tool-calls needs --chat"),
        (["--tool-choice", "maybe", "--chat"], "invalid choice"),
        (["--tls-ca-file", "/no/such.pem"], "cannot read /no/such.pem"),
    ],
)
def test_bad_flags_are_usage_errors(argv, says, capsys) -> None:
    with pytest.raises(SystemExit) as done:
        parse(["p", *argv])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert "usage: nanoserve generate" in err and says in err and "Traceback" not in err


def test_connection_flags_become_client_keywords(tmp_path: Path, monkeypatch, capsys) -> None:
    pem = {name: tmp_path / name for name in ("ca.pem", "c.pem", "c.key")}
    for name, path in pem.items():
        path.write_bytes(f"PEM {name}".encode())
    monkeypatch.delenv("NANOSERVE_CA_FILE", raising=False)
    monkeypatch.setenv("NANOSERVE_TOKEN", TOKEN)
    args = parse(
        ["p", "--address", "h:1", "--timeout", "3", "--tls-ca-file", str(pem["ca.pem"])]
        + ["--tls-client-cert-file", str(pem["c.pem"]), "--tls-client-key-file", str(pem["c.key"])]
    )
    assert args.client == {
        "address": "h:1",
        "timeout": 3.0,
        "root_certificates": b"PEM ca.pem",
        "client_cert": b"PEM c.pem",
        "client_key": b"PEM c.key",
        "token": TOKEN,
    }
    assert parse(["p", "--tls", "--token", "other"]).client == {
        "address": "127.0.0.1:50051",
        "timeout": None,
        "root_certificates": True,
        "token": "other",
    }
    monkeypatch.setenv("NANOSERVE_CA_FILE", str(pem["ca.pem"]))
    assert parse(["p"]).client["root_certificates"] == b"PEM ca.pem"
    assert "warning" not in capsys.readouterr().err
    monkeypatch.delenv("NANOSERVE_CA_FILE")
    parse(["p", "--address", "10.1.2.3:50051"])  # the env token, in plaintext, off this machine
    err = capsys.readouterr().err
    assert "plaintext" in err and TOKEN not in err
    with pytest.raises(SystemExit):
        parse(["p", "--tls-client-cert-file", str(pem["c.pem"])])
    assert "go together" in capsys.readouterr().err
    monkeypatch.delenv("NANOSERVE_TOKEN")
    assert "token" not in parse(["p"]).client


class ScriptedFrontend(frontend_grpc.FrontendServiceServicer):
    """Answers every call from the request alone: with n completions `[index] text` in two pieces
    (interleaved), logprobs when asked, one tool call and reasoning on Chat; refuses calls without
    the bearer token when `token` is set."""

    def __init__(self, token: str | None = None) -> None:
        self.token = token
        self.requests: list = []

    def _check(self, context: grpc.ServicerContext) -> None:
        metadata = dict(context.invocation_metadata())
        if self.token and metadata.get("authorization") != f"Bearer {self.token}":
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or unknown bearer token")

    def _stream(self, request, response_type, chat: bool) -> Iterator:
        self.requests.append(request)
        params = request.sampling_params
        n = params.n or 1
        for index in range(n):
            first = response_type(text=f"c{index}", token_ids=[7], index=index)
            if index == 0 and request.return_prompt_token_ids:  # on the call's first message
                first.prompt_token_ids.extend([1, 2, 3])
            if chat:
                first.reasoning_content = "hmm"
            if params.HasField("logprobs"):
                alternative = common_pb2.TokenLogprob(token_id=7, logprob=-0.5, text=" a")
                first.logprobs.add(
                    token_id=7, logprob=-0.5, rank=1, text=" a",
                    top_logprobs=[alternative] * params.logprobs,
                )  # fmt: skip
            yield first
        for index in range(n):
            final = response_type(
                text="!", token_ids=[8], index=index, finish_reason=common_pb2.FINISH_REASON_STOP
            )
            if chat:
                final.tool_calls.add(id="call-1", type="function").function.name = "weather"
                final.tool_calls[0].function.arguments = "{}"
            if index == n - 1:  # the call's last message carries its usage
                final.usage.CopyFrom(common_pb2.Usage(prompt_tokens=2, completion_tokens=2 * n))
            yield final

    def Generate(self, request, context):
        self._check(context)
        yield from self._stream(request, frontend_pb2.GenerateResponse, chat=False)

    def Chat(self, request, context):
        self._check(context)
        yield from self._stream(request, frontend_pb2.ChatResponse, chat=True)

    def Tokenize(self, request, context):
        self._check(context)
        self.requests.append(request)
        return frontend_pb2.TokenizeResponse(token_ids=[ord(c) for c in request.text])

    def Detokenize(self, request, context):
        self._check(context)
        if any(i > 1000 for i in request.token_ids):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "token_ids[0]: outside the vocabulary")
        texts = [chr(i) for i in request.token_ids]
        return frontend_pb2.DetokenizeResponse(text="".join(texts), token_texts=texts)


def main(argv: list[str]) -> object:
    """`nanoserve ARGV`'s exit code."""
    with pytest.raises(SystemExit) as done:
        cli.main(argv)
    return done.value.code


def serve(fake: ScriptedFrontend) -> Iterator[tuple[str, ScriptedFrontend]]:
    server = grpc.server(ThreadPoolExecutor(2))
    frontend_grpc.add_FrontendServiceServicer_to_server(fake, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}", fake
    server.stop(0)


@pytest.fixture
def frontend(monkeypatch) -> Iterator[tuple[str, ScriptedFrontend]]:
    monkeypatch.delenv("NANOSERVE_TOKEN", raising=False)
    monkeypatch.delenv("NANOSERVE_CA_FILE", raising=False)
    yield from serve(ScriptedFrontend())


def test_n_completions_print_labelled_by_index(frontend, capsys) -> None:
    address, _ = frontend
    assert cli.generate(["p", "--address", address, "--n", "2", "--usage"]) == 0
    out, err = capsys.readouterr()
    assert out == "[0] c0!\n[1] c1!\n"
    assert "finish_reason=stop,stop prompt_tokens=2 completion_tokens=4" in err


def test_logprobs_lines_follow_the_text(frontend, capsys) -> None:
    address, _ = frontend
    assert cli.generate(["p", "--address", address, "--logprobs", "2"]) == 0
    out, err = capsys.readouterr()
    assert out == "c0!\n"
    assert err == '7\t-0.5000\t" a"\t" a"=-0.5000 " a"=-0.5000\n'


def test_json_lines(frontend, capsys) -> None:
    address, _ = frontend
    assert cli.generate(["p", "--address", address, "--json", "--n", "2", "--logprobs", "1"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(x["index"], x["text"], x["finish_reason"], x["token_ids"]) for x in lines] == [
        (0, "c0!", "stop", [7, 8]),
        (1, "c1!", "stop", [7, 8]),
    ]
    assert lines[0]["logprobs"] == [
        {
            "token_id": 7,
            "logprob": -0.5,
            "rank": 1,
            "text": " a",
            "top_logprobs": [{"token_id": 7, "logprob": -0.5, "text": " a"}],
        }
    ]


def test_prompt_token_ids_to_stderr_or_in_each_json_line(frontend, capsys) -> None:
    address, fake = frontend
    assert cli.generate(["p", "--address", address, "--prompt-token-ids"]) == 0
    out, err = capsys.readouterr()
    assert (out, err) == ("c0!\n", "prompt_token_ids=1 2 3\n")
    assert fake.requests[-1].return_prompt_token_ids
    assert (
        cli.generate(["p", "--address", address, "--json", "--n", "2", "--prompt-token-ids"]) == 0
    )
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [x["prompt_token_ids"] for x in lines] == [[1, 2, 3], [1, 2, 3]]
    assert cli.generate(["p", "--address", address, "--json"]) == 0  # not asked: not there
    assert "prompt_token_ids" not in json.loads(capsys.readouterr().out)
    assert not fake.requests[-1].return_prompt_token_ids


def test_chat_prints_reasoning_to_stderr_and_tool_calls_as_json(frontend, capsys) -> None:
    address, fake = frontend
    argv = [
        "q",
        "--address",
        address,
        "--chat",
        "--separate-reasoning",
        "--tools",
        json.dumps(TOOLS),
    ]
    assert cli.generate(argv) == 0
    out, err = capsys.readouterr()
    call = {"id": "call-1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}
    assert out.splitlines() == ["c0!", json.dumps(call)]
    assert err == "hmm\n"
    request = fake.requests[-1]
    assert request.separate_reasoning and request.tools[0].function.name == "weather"
    assert cli.generate([*argv, "--n", "2"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines() == [
        "[0] c0!",
        json.dumps({"index": 0, **call}),
        "[1] c1!",
        json.dumps({"index": 1, **call}),
    ]
    assert err == "[0] reasoning: hmm\n[1] reasoning: hmm\n"


def test_tokenize_and_detokenize(frontend, capsys) -> None:
    address, fake = frontend
    assert main(["tokenize", "hi", "--address", address, "--no-add-special-tokens"]) == 0
    assert capsys.readouterr().out == "104 105\n"
    assert fake.requests[-1].HasField("add_special_tokens")
    assert main(["detokenize", "104", "105", "--address", address]) == 0
    assert capsys.readouterr().out == "hi\n"
    assert main(["detokenize", "104", "32", "--per-token", "--address", address]) == 0
    assert capsys.readouterr().out == '104\t"h"\n32\t" "\n'
    assert main(["detokenize", "5000", "--address", address]) == 1
    err = capsys.readouterr().err
    assert err == "error: INVALID_ARGUMENT: token_ids[0]: outside the vocabulary\n"
    assert main(["detokenize", "-1", "--address", address]) == 2
    assert "not a token id" in capsys.readouterr().err


def test_a_token_goes_with_every_command_and_is_never_printed(monkeypatch, capsys) -> None:
    monkeypatch.delenv("NANOSERVE_CA_FILE", raising=False)
    monkeypatch.delenv("NANOSERVE_TOKEN", raising=False)
    for address, _ in serve(ScriptedFrontend(token=TOKEN)):
        assert cli.generate(["p", "--address", address]) == 1
        out, err = capsys.readouterr()
        assert err == "error: UNAUTHENTICATED: missing or unknown bearer token\n"
        monkeypatch.setenv("NANOSERVE_TOKEN", TOKEN)
        assert cli.generate(["p", "--address", address]) == 0
        assert main(["tokenize", "a", "--address", address]) == 0
        assert main(["detokenize", "97", "--address", address]) == 0
        out, err = capsys.readouterr()
        assert out == "c0!\n97\na\n" and err == ""
    for command in ("generate", "tokenize", "detokenize"):
        with pytest.raises(SystemExit):
            cli.main([command, "--help"])
        assert TOKEN not in capsys.readouterr().out


def test_serve_hint_for_tls_and_api_keys(tmp_path: Path) -> None:
    plain = Connection("127.0.0.1:50051")
    assert plain.command() == 'nanoserve generate --address 127.0.0.1:50051 "Hello"'
    assert plain.python() == (
        'python -c "from nanoserve import Client; '
        "print(Client('127.0.0.1:50051').generate('Hello').text)\""
    )
    from nanoserve.frontend.config import FrontendConfig

    config = FrontendConfig(
        model="tiny",
        worker_address="w:1",
        tls_cert_file="cert.pem",
        tls_key_file="key.pem",
        tls_client_ca_file="ca.pem",
        api_keys=TOKEN,
    )
    probe = argparse.Namespace(
        probe_tls_ca_file=None, probe_tls_client_cert_file="/p/c.pem", probe_tls_client_key_file="k"
    )
    secured = cli.hint_connection("127.0.0.1:9", config, probe)
    cert, key = os.path.abspath("cert.pem"), os.path.abspath("k")
    assert secured.command() == (
        f"NANOSERVE_TOKEN=KEY nanoserve generate --address 127.0.0.1:9 --tls-ca-file {cert} "
        f'--tls-client-cert-file /p/c.pem --tls-client-key-file {key} "Hello"'
    )
    assert secured.python() == (
        'NANOSERVE_TOKEN=KEY python -c "import os; from nanoserve import Client; '
        f"print(Client('127.0.0.1:9', root_certificates={cert!r}, client_cert='/p/c.pem', "
        f"client_key={key!r}, token=os.environ['NANOSERVE_TOKEN']).generate('Hello').text)\""
    )
    assert TOKEN not in secured.command() + secured.python()
