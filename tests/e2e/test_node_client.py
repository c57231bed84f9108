"""A client in another language, written from the .proto files alone: clients/node/generate.js
(@grpc/grpc-js + @grpc/proto-loader) streams the same text as the Python client, in plaintext and
over TLS with a bearer token, and reaches the API's features: structured output, logit bias, forced
tool calls, Tokenize and Detokenize."""

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager

import pytest

from nanoserve.client import Client
from tests.e2e.conftest import REPO_ROOT, Service, start_frontend

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


def run_node(node: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [node, str(NODE_CLIENT / "generate.js"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={k: v for k, v in os.environ.items() if not k.startswith("NANOSERVE_")} | env,
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


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather now in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def test_node_client_chat_matches_the_python_client(node, services, tmp_path) -> None:
    """--chat sends the prompt as one user message; with --separate-reasoning and --tools the
    text, reasoning (stderr) and tool calls (JSON lines) are the Python client's for the same
    greedy request (random weights write no tags: the tools reach the prompt, usage shows it)."""
    prompt = "Weather in Paris?"
    tools_file = tmp_path / "tools.json"
    tools_file.write_text(json.dumps([WEATHER]))
    address = ("--address", services.frontend.address, "--max-tokens", "12")
    with Client(services.frontend.address, timeout=30) as client:
        plain = client.chat([("user", prompt)], temperature=0, max_tokens=12)
        n2 = client.chat([("user", prompt)], temperature=0, max_tokens=12, n=2, priority=1)
        tooled = client.chat(
            [("user", prompt)],
            temperature=0,
            max_tokens=12,
            separate_reasoning=True,
            tools=[WEATHER],
        )
    assert tooled.usage.prompt_tokens > plain.usage.prompt_tokens + 50  # the tools are rendered
    chat = run_node(node, *address, "--chat", prompt)
    assert chat.returncode == 0, chat.stderr
    assert chat.stdout == universal_newlines(plain.text + "\n")
    pair = run_node(node, *address, "--chat", "--n", "2", "--priority", "1", prompt)
    assert pair.returncode == 0, pair.stderr
    assert pair.stdout == as_printed(n2.choices)
    args = ("--chat", "--separate-reasoning", "--tools", str(tools_file), prompt)
    result = run_node(node, *address, *args)
    assert result.returncode == 0, result.stderr
    calls = "".join(compact(c.to_dict()) + "\n" for c in tooled.tool_calls)
    assert result.stdout == universal_newlines(tooled.text + "\n" + calls)
    assert result.stderr == universal_newlines(tooled.reasoning_content)
    no_chat = run_node(node, *address, "--tools", str(tools_file), prompt)
    assert no_chat.returncode == 2 and "need --chat" in no_chat.stderr


def test_node_client_prints_reasoning_and_tool_calls(node, tmp_path) -> None:
    """Against a stand-in FrontendService that replies as a Qwen3 with tools would (the tiny
    model's random weights never do): the request carries what the flags say, the reasoning
    goes to stderr, each completed tool call is one JSON line after the text."""
    from nanoserve.proto.v1 import common_pb2
    from nanoserve.proto.v1 import frontend_service_pb2 as pb
    from nanoserve.proto.v1 import frontend_service_pb2_grpc as pb_grpc

    received: list = []
    call = pb.ToolCall(
        id="call_0",
        type="function",
        function=pb.ToolCallFunction(name="get_weather", arguments='{"city": "Paris"}'),
    )

    class Frontend(pb_grpc.FrontendServiceServicer):
        def Chat(self, request, context):
            received.append(request)
            yield pb.ChatResponse(reasoning_content="The user wants ", index=1)
            yield pb.ChatResponse(reasoning_content="the weather.", index=0)
            yield pb.ChatResponse(text="Let me check.", index=0)
            yield pb.ChatResponse(text="Checking.", tool_calls=[call], index=1)
            yield pb.ChatResponse(finish_reason=common_pb2.FINISH_REASON_STOP, index=0)
            yield pb.ChatResponse(finish_reason=common_pb2.FINISH_REASON_STOP, index=1)

    tools_path = tmp_path / "tools.json"
    tools_path.write_text(json.dumps([WEATHER]))
    with stand_in(Frontend()) as address:
        result = run_node(
            node,
            "--address", address,
            "--chat", "--separate-reasoning", "--tools", str(tools_path),
            "--n", "2", "--priority", "-1", "--max-tokens", "9",
            "Weather in Paris?",
        )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout == (
        "[0] Let me check.\n[1] Checking.\n" + compact({"index": 1, **call_dict(call)}) + "\n"
    )
    assert result.stderr == "The user wants the weather."
    [request] = received
    assert [(m.role, m.content) for m in request.messages] == [("user", "Weather in Paris?")]
    assert request.separate_reasoning and request.priority == -1
    assert request.sampling_params.n == 2 and request.sampling_params.max_tokens == 9
    assert [t.function.name for t in request.tools] == ["get_weather"]
    assert json.loads(request.tools[0].function.parameters) == WEATHER["function"]["parameters"]


AGE = {
    "type": "object",
    "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 120}},
    "required": ["age"],
    "additionalProperties": False,
}


def test_node_client_json_schema_output_validates(node, services, tmp_path) -> None:
    """--json-schema @FILE: the worker's grammar engine ends the JSON (random weights)."""
    jsonschema = pytest.importorskip("jsonschema")
    pytest.importorskip("xgrammar")
    schema = tmp_path / "age.json"
    schema.write_text(json.dumps(AGE))
    result = run_node(
        node, "--address", services.frontend.address, "--json-schema", f"@{schema}",
        "--temperature", "1", "--seed", "1", "--max-tokens", "64", "An age as JSON:",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    jsonschema.validate(json.loads(result.stdout), AGE)


def test_node_client_token_ids_round_trip_and_logit_bias_forces_one(node, services) -> None:
    """--tokenize prints the Python client's ids, --detokenize reads them back, and
    --logit-bias ID=100 makes that id every greedy token."""
    address = ("--address", services.frontend.address)
    text = "The sea is 你好🙂"
    with Client(services.frontend.address, timeout=30) as client:
        want = client.tokenize(text)
        (wave,) = client.tokenize(" wave")
    tokenized = run_node(node, *address, "--tokenize", text)
    assert tokenized.returncode == 0, tokenized.stderr
    assert tokenized.stdout == " ".join(map(str, want)) + "\n"
    detokenized = run_node(node, *address, "--detokenize", *tokenized.stdout.split())
    assert detokenized.returncode == 0, detokenized.stderr
    assert detokenized.stdout == text + "\n"
    biased = run_node(node, *address, "--max-tokens", "3", "--logit-bias", f"{wave}=100", "Hi")
    assert biased.returncode == 0, biased.stderr
    assert biased.stdout == " wave" * 3 + "\n"
    out_of_vocab = run_node(node, *address, "--detokenize", str(10**9))
    assert out_of_vocab.returncode == 1
    assert out_of_vocab.stderr.startswith("error: INVALID_ARGUMENT: token_ids")


# every instance short: a random model's forced call ends well within max_tokens
CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 8}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {"type": "object", "properties": {"tz": {"enum": ["UTC", "CET"]}}},
    },
}


def test_node_client_forces_the_named_tool(node, services, tmp_path) -> None:
    """--tool-function NAME: the worker constrains the reply to one call of NAME whose arguments
    fit its schema (thinking off: a random model would not close a think block)."""
    jsonschema = pytest.importorskip("jsonschema")
    pytest.importorskip("xgrammar")
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": CITY}}
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps([TIME, weather]))
    result = run_node(
        node, "--address", services.frontend.address, "--chat", "--no-thinking",
        "--tools", str(tools), "--tool-function", "get_weather",
        "--temperature", "1", "--seed", "3", "--max-tokens", "256", "Weather in Paris?",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    text, *lines = result.stdout.splitlines()
    assert text == ""
    (call,) = [json.loads(line) for line in lines]
    assert call["type"] == "function" and call["function"]["name"] == "get_weather"
    jsonschema.validate(json.loads(call["function"]["arguments"]), CITY)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-token", "3"], "unknown option --max-token"),
        (["--logit-bias", "9707"], "expected ID=BIAS"),
        (["--logit-bias", "x=1"], "not a token id"),
        (["--allowed-token-ids", "1,-2"], "not a token id"),
        (["--chat", "--tool-choice", "always"], "--tool-choice must be one of auto, none"),
        (["--tool-function", "f"], "need --chat"),
        (["--json-schema", "@/nonexistent/schema.json"], "cannot read /nonexistent"),
        (["--regex", "a+", "--json-object"], "--regex and --json-object are mutually exclusive"),
        (["--grammar", "root ::= 'a'", "--structural-tag", "{}"], "mutually exclusive"),
        (["--detokenize", "12", "abc"], "not a token id"),
        (["--seed"], "--seed needs a value"),
        (["--ca", "/nonexistent/ca.pem"], "--ca: cannot read /nonexistent/ca.pem"),
    ],
)
def test_node_client_refuses_bad_options(node, args, message) -> None:
    """Exit 2 before any call (the address is never dialled); the prompt first: --seed last."""
    result = run_node(node, "--address", "127.0.0.1:9", "hi", *args)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error: ") and message in result.stderr
    assert result.stdout == ""


def test_node_client_sends_the_api_fields(node, tmp_path) -> None:
    """Against a stand-in: each structured output option, logit_bias, allowed_token_ids,
    tool_choice and enable_thinking reach the request as the proto spells them, and a chunk with
    tool_call_parse_error is noted on stderr."""
    from nanoserve.proto.v1 import common_pb2
    from nanoserve.proto.v1 import frontend_service_pb2 as pb
    from nanoserve.proto.v1 import frontend_service_pb2_grpc as pb_grpc

    received: list = []
    done = {"finish_reason": common_pb2.FINISH_REASON_STOP}

    class Frontend(pb_grpc.FrontendServiceServicer):
        def Generate(self, request, context):
            received.append(request)
            yield pb.GenerateResponse(text="ok", **done)

        def Chat(self, request, context):
            received.append(request)
            yield pb.ChatResponse(text="<tool_call>{oops</tool_call>", tool_call_parse_error=True)
            yield pb.ChatResponse(**done)

    grammar = tmp_path / "grammar.gbnf"
    grammar.write_text('root ::= "yes" | "no"\n')
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps([WEATHER]))
    with stand_in(Frontend()) as address:
        runs = [
            run_node(node, "--address", address, *args, "hi")
            for args in (
                ("--json-schema", json.dumps(AGE)),
                ("--regex", "[a-z]+"),
                ("--grammar", f"@{grammar}"),
                ("--json-object",),
                ("--structural-tag", '{"type": "structural_tag"}'),
                ("--logit-bias", "7=100", "--logit-bias", "9=-2.5", "--logit-bias", "7=-100"),
                ("--allowed-token-ids", "3,5", "--allowed-token-ids", "8"),
                (
                    "--chat",
                    "--tools",
                    str(tools),
                    "--tool-choice",
                    "required",
                    "--no-thinking",
                    "--no-parallel-tool-calls",
                ),
                ("--chat", "--tools", str(tools), "--tool-function", "get_weather"),
            )
        ]
    for result in runs:
        assert result.returncode == 0, result.stderr
    assert [r.stdout for r in runs[:7]] == ["ok\n"] * 7
    outputs = [r.sampling_params.structured_output for r in received[:5]]
    assert [o.WhichOneof("kind") for o in outputs] == [
        "json_schema", "regex", "grammar", "json_object", "structural_tag",
    ]  # fmt: skip
    assert json.loads(outputs[0].json_schema) == AGE and outputs[1].regex == "[a-z]+"
    assert outputs[2].grammar == grammar.read_text() and outputs[3].json_object
    assert outputs[4].structural_tag == '{"type": "structural_tag"}'
    assert dict(received[5].sampling_params.logit_bias) == {7: -100.0, 9: -2.5}
    assert list(received[6].sampling_params.allowed_token_ids) == [3, 5, 8]
    required, named = received[7:]
    assert required.tool_choice == "required" and not required.enable_thinking
    assert required.HasField("enable_thinking") and not required.tool_choice_function
    assert named.tool_choice_function == "get_weather" and not named.HasField("enable_thinking")
    assert required.HasField("parallel_tool_calls") and not required.parallel_tool_calls
    assert not named.HasField("parallel_tool_calls")
    assert runs[7].stdout == "<tool_call>{oops</tool_call>\n"
    assert runs[7].stderr == "warning: a <tool_call> block held no valid call\n"


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


def call_dict(call) -> dict:
    return {
        "id": call.id,
        "type": call.type,
        "function": {"name": call.function.name, "arguments": call.function.arguments},
    }


def compact(value: dict) -> str:
    """JSON as JavaScript's JSON.stringify writes it."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def universal_newlines(text: str) -> str:
    """What run_node's text mode reads back for `text` (random weights write \\r too)."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def as_printed(choices) -> str:
    """The --n output: each completion prefixed by its index."""
    return universal_newlines("".join(f"[{i}] {c.text}\n" for i, c in enumerate(choices)))
