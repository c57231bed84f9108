"""A client in another language, written from the .proto files alone: clients/node/generate.js
(@grpc/grpc-js + @grpc/proto-loader) streams the same text as the Python client, in plaintext and
over TLS with a bearer token."""

import json
import os
import shutil
import subprocess
from collections.abc import Iterator

import pytest

from nanoserve.client import Client
from tests.e2e.conftest import REPO_ROOT, Service, start_frontend
from tests.tls_certs import Certs, make_certs

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
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


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
    from concurrent import futures

    import grpc

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

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_FrontendServiceServicer_to_server(Frontend(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        tools_path = tmp_path / "tools.json"
        tools_path.write_text(json.dumps([WEATHER]))
        result = run_node(
            node,
            "--address", f"127.0.0.1:{port}",
            "--chat", "--separate-reasoning", "--tools", str(tools_path),
            "--n", "2", "--priority", "-1", "--max-tokens", "9",
            "Weather in Paris?",
        )  # fmt: skip
    finally:
        server.stop(None)
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
