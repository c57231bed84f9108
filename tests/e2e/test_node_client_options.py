"""clients/node/generate.js reaches the API's fields: structured output, logit bias, allowed token
ids, tool choice, Tokenize and Detokenize; a bad option exits 2 before any call."""

import json

import pytest

from nanoserve.client import Client
from tests.e2e.node_client_process import AGE, find_node, run_node, stand_in
from tests.weather_tool import WEATHER

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def node() -> str:
    return find_node()


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
