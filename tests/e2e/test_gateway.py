"""The OpenAI-compatible gateway end to end: the official `openai` SDK (sync and async) against
`python -m nanoserve.frontend.gateway` in front of the real frontend and worker (tiny model, CPU).
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import re
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from nanoserve import Client
from tests.conftest import free_port
from tests.e2e.conftest import Pair, Service, assert_idle, start_frontend, start_pair

openai = pytest.importorskip("openai", reason="pip install openai (the dev extra)")
pytestmark = pytest.mark.e2e

GATEWAY_LISTENING = re.compile(r"gateway listening on (?P<host>\S+):(?P<port>\d+)")
KEY = "gateway-test-key"
MESSAGES = [{"role": "user", "content": "Say something about the sea."}]


def start_gateway(frontend_address: str, *args: str) -> Service:
    gateway = Service(
        "gateway",
        [
            sys.executable,
            "-m",
            "nanoserve.frontend.gateway",
            *("--frontend-address", frontend_address, "--port", "0", *args),
        ],
        listening=GATEWAY_LISTENING,
    )
    try:
        gateway.wait_listening()
    except BaseException:
        gateway.kill()
        raise
    return gateway


def request_json(method: str, url: str, body: dict | bytes | None = None, token: str | None = None):
    """(status, parsed JSON body) of one plain HTTP request."""
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def base_url(gateway: Service) -> str:
    return f"http://127.0.0.1:{gateway.port}"


@pytest.fixture(scope="module")
def gateway(services: Pair) -> Iterator[Service]:
    gateway = start_gateway(services.frontend.address)
    yield gateway
    assert gateway.stop() == 0, gateway.output()


@pytest.fixture(scope="module")
def model(gateway: Service) -> str:
    client = openai.OpenAI(base_url=base_url(gateway) + "/v1", api_key="unused")
    (model,) = client.models.list().data
    return model.id


@pytest.fixture(scope="module")
def sdk(gateway: Service) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url(gateway) + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def guarded(tiny_model_dir: Path) -> Iterator[tuple[Pair, Service]]:
    """A frontend with an API key and room for one request at a time, and its gateway."""
    pair = start_pair(
        tiny_model_dir, frontend_args=("--api-keys", KEY, "--max-concurrent-requests", "1")
    )
    gateway = start_gateway(pair.frontend.address)
    yield pair, gateway
    gateway.stop()
    pair.stop()


def test_models_lists_the_served_model(gateway: Service, model: str, services: Pair) -> None:
    with Client(services.frontend.address) as client:
        assert model == client.model_info().model_name
    status, body = request_json("GET", base_url(gateway) + "/v1/models")
    assert status == 200 and body["object"] == "list"
    assert [m["id"] for m in body["data"]] == [model]
    assert request_json("GET", base_url(gateway) + "/health") == (200, {"status": "SERVING"})


def test_sync_streams_completion_and_chat_with_usage(sdk: openai.OpenAI, model: str) -> None:
    stream = sdk.completions.create(
        model=model,
        prompt="The sea is",
        max_tokens=12,
        temperature=0,
        extra_body={"ignore_eos": True},
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 12
    assert chunks[-2].choices[0].finish_reason == "length"
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    whole = sdk.completions.create(
        model=model,
        prompt="The sea is",
        max_tokens=12,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert whole.choices[0].text == text and whole.usage.completion_tokens == 12
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + 12

    chat = list(
        sdk.chat.completions.create(
            model=model,
            messages=MESSAGES,
            max_completion_tokens=10,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True, "chat_template_kwargs": {"enable_thinking": False}},
        )
    )
    assert chat[0].choices[0].delta.role == "assistant"
    assert chat[-1].choices == [] and chat[-1].usage.completion_tokens == 10
    assert chat[-2].choices[0].finish_reason == "length"
    assert all(c.usage is None for c in chat[:-1])


def test_async_streams_completion_and_chat_with_usage(gateway: Service, model: str) -> None:
    async def run() -> tuple[str, str, int, int]:
        client = openai.AsyncOpenAI(base_url=base_url(gateway) + "/v1", api_key="unused")
        try:
            texts, counts = [], []
            for stream in (
                await client.completions.create(
                    model=model,
                    prompt="Waves",
                    max_tokens=8,
                    temperature=0,
                    stream=True,
                    stream_options={"include_usage": True},
                    extra_body={"ignore_eos": True},
                ),
                await client.chat.completions.create(
                    model=model,
                    messages=MESSAGES,
                    max_tokens=8,
                    temperature=0,
                    stream=True,
                    stream_options={"include_usage": True},
                    extra_body={"ignore_eos": True},
                ),
            ):
                parts, usage = [], None
                async for chunk in stream:
                    if chunk.usage is not None:
                        usage = chunk.usage
                    for choice in chunk.choices:
                        parts.append(getattr(choice, "text", None) or choice.delta.content or "")
                texts.append("".join(parts))
                counts.append(usage.completion_tokens)
            return texts[0], texts[1], counts[0], counts[1]
        finally:
            await client.close()

    completion_text, chat_text, n_completion, n_chat = asyncio.run(run())
    assert (n_completion, n_chat) == (8, 8)
    assert completion_text and chat_text


def test_stop_strings_end_the_reply(sdk: openai.OpenAI, model: str) -> None:
    free = sdk.completions.create(
        model=model,
        prompt="The sea is",
        max_tokens=24,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    text = free.choices[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    assert stop.strip(), f"need a visible stop string in {text!r}"
    for stop_param in (stop, [stop, "\x00never"]):
        stopped = sdk.completions.create(
            model=model, prompt="The sea is", max_tokens=24, temperature=0, stop=stop_param
        )
        assert stopped.choices[0].finish_reason == "stop"
        assert stopped.choices[0].text == text[: text.index(stop)]
    chunks = sdk.completions.create(
        model=model, prompt="The sea is", max_tokens=24, temperature=0, stop=stop, stream=True
    )
    assert "".join(c.choices[0].text for c in chunks) == text[: text.index(stop)]


def test_chat_text_equals_the_grpc_chat_reply(
    sdk: openai.OpenAI, model: str, services: Pair
) -> None:
    with Client(services.frontend.address) as client:
        expected = client.chat(MESSAGES, max_tokens=20, temperature=0, enable_thinking=False)
    reply = sdk.chat.completions.create(
        model=model,
        messages=MESSAGES,
        max_tokens=20,
        temperature=0,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    assert reply.choices[0].message.content == expected.text
    assert reply.choices[0].finish_reason == expected.finish_reason
    assert reply.usage.prompt_tokens == expected.usage.prompt_tokens
    streamed = sdk.chat.completions.create(
        model=model,
        messages=MESSAGES,
        max_tokens=20,
        temperature=0,
        stream=True,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == expected.text


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"n": 0}, "n"),
        ({"logprobs": 21}, "logprobs"),
        ({"temperature": -1.0}, "temperature"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"extra_body": {"top_k": -5}}, "top_k"),
        ({"extra_body": {"frobnicate": 1}}, "frobnicate"),
        ({"n": 2, "best_of": 1}, "best_of"),
        ({"stop": ["ok", ""]}, "stop[1]"),
    ],
)
def test_a_bad_parameter_is_400_in_openai_shape(
    sdk: openai.OpenAI, model: str, kwargs: dict, param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        sdk.completions.create(model=model, prompt="Hi", **kwargs)
    error = raised.value.body
    assert raised.value.status_code == 400
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert param.split("[")[0] in error["message"]


def test_chat_refuses_unknown_tools_and_bad_schemas_by_name(sdk: openai.OpenAI, model: str) -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    bad_schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}
    named = {"type": "function", "function": {"name": "g"}}
    for kwargs, param in (
        ({"tools": [tool], "tool_choice": named}, "tool_choice"),
        ({"response_format": bad_schema}, "response_format"),
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ):
        with pytest.raises(openai.BadRequestError) as raised:
            sdk.chat.completions.create(model=model, **{"messages": MESSAGES, **kwargs})
        assert raised.value.body["param"] == param


def test_plain_http_errors_keep_openai_shape(gateway: Service, model: str) -> None:
    url = base_url(gateway)
    status, body = request_json("POST", url + "/v1/completions", b"{not json")
    assert status == 400 and set(body["error"]) == {"message", "type", "param", "code"}
    status, body = request_json("POST", url + "/v1/completions", {"model": "other", "prompt": "x"})
    assert status == 404 and body["error"]["param"] == "model"
    # a body past --max-body-bytes (default 8 MiB) is refused by its Content-Length, unread
    connection = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=30)
    connection.putrequest("POST", "/v1/completions")
    connection.putheader("Content-Type", "application/json")
    connection.putheader("Content-Length", str(9 * 1024 * 1024))
    connection.endheaders()
    response = connection.getresponse()
    assert response.status == 413
    assert json.loads(response.read())["error"]["code"] == "request_too_large"
    connection.close()
    status, body = request_json("GET", url + "/v1/nothing")
    assert status == 404 and "error" in body


def test_client_disconnect_cancels_the_grpc_call(
    gateway: Service, model: str, services: Pair
) -> None:
    request = {
        "model": model,
        "prompt": "Hi",
        "max_tokens": 3000,
        "ignore_eos": True,
        "stream": True,
    }
    data = json.dumps(request).encode()
    http_request = urllib.request.Request(base_url(gateway) + "/v1/completions", data=data)
    http_request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(http_request, timeout=60) as response:
        assert response.readline().startswith(b"data: ")
    assert_idle(services.worker.address, timeout=10.0)


def test_admission_full_is_429_and_tokens_are_checked(guarded: tuple[Pair, Service]) -> None:
    pair, gateway = guarded
    url = base_url(gateway) + "/v1"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=url, api_key="wrong", max_retries=0).models.list()
    status, body = request_json("GET", url + "/models")
    assert status == 401 and body["error"]["type"] == "authentication_error"
    assert request_json("GET", base_url(gateway) + "/health")[0] == 200  # health stays open
    sdk = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0)
    (model,) = [m.id for m in sdk.models.list().data]
    assert request_json("GET", url + "/models")[0] == 401  # still checked once the name is known
    status, body = request_json("POST", url + "/completions", {"model": model, "prompt": "x"})
    assert status == 401 and body["error"]["code"] == "unauthenticated"
    with Client(pair.frontend.address, token=KEY) as client:
        busy = client.generate_stream("Hi", max_tokens=3000, ignore_eos=True)
        next(busy)  # the one admitted request runs
        try:
            with pytest.raises(openai.RateLimitError) as raised:
                sdk.completions.create(model=model, prompt="Hi", max_tokens=4)
            assert raised.value.status_code == 429
            assert raised.value.body["type"] == "rate_limit_error"
        finally:
            busy.close()
    deadline = time.monotonic() + 10
    while True:  # the slot frees once the cancelled call has ended on the frontend
        try:
            done = sdk.completions.create(model=model, prompt="Hi", max_tokens=4)
            break
        except openai.RateLimitError:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    assert done.usage.completion_tokens <= 4


def test_gateway_reaches_a_mutual_tls_frontend_with_the_callers_key(
    services: Pair, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """One keys file for gRPC and HTTP; the gateway dials TLS with a client certificate."""
    from tests.tls_certs import make_certs

    certs = make_certs(tmp_path / "certs")
    keys = tmp_path / "api_keys"
    keys.write_text(f"tenant-a {KEY}\n")
    frontend = start_frontend(
        tiny_model_dir,
        services.worker.address,
        *("--tls-cert-file", str(certs.server_cert), "--tls-key-file", str(certs.server_key)),
        *("--tls-client-ca-file", str(certs.ca), "--api-keys-file", str(keys)),
        wait=False,
    )
    tls = {"root_certificates": certs.ca, "client_cert": certs.client_cert}
    try:
        with Client(frontend.wait_listening(), client_key=certs.client_key, **tls) as client:
            client.wait_ready(timeout=90)
        gateway = start_gateway(
            f"localhost:{frontend.port}",  # the name the server certificate holds
            *("--tls-root-certificates-file", str(certs.ca)),
            *("--tls-client-cert-file", str(certs.client_cert)),
            *("--tls-client-key-file", str(certs.client_key)),
        )
        try:
            url = base_url(gateway) + "/v1"
            sdk = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0)
            (model,) = [m.id for m in sdk.models.list().data]
            reply = sdk.completions.create(model=model, prompt="Hi", max_tokens=3)
            assert reply.usage.completion_tokens == 3
            with pytest.raises(openai.AuthenticationError):
                openai.OpenAI(base_url=url, api_key="wrong", max_retries=0).completions.create(
                    model=model, prompt="Hi", max_tokens=3
                )
            assert request_json("GET", base_url(gateway) + "/health")[0] == 200
        finally:
            assert gateway.stop() == 0, gateway.output()
    finally:
        frontend.stop()


def test_tokenize_and_detokenize_routes(gateway: Service, services: Pair, model: str) -> None:
    """vLLM's /tokenize and /detokenize: the frontend's tokenizer, a wrong model is a 404, and a
    bad id a 400 naming `tokens`."""
    url = base_url(gateway)
    with Client(services.frontend.address, timeout=30) as client:
        ids, info = client.tokenize("Hello world"), client.model_info()
    status, body = request_json(
        "POST", url + "/tokenize", {"model": model, "prompt": "Hello world"}
    )
    assert status == 200 and body == {
        "tokens": ids,
        "count": len(ids),
        "max_model_len": info.max_model_len,
    }
    status, body = request_json("POST", url + "/detokenize", {"tokens": ids})
    assert status == 200 and body == {"prompt": "Hello world"}
    status, body = request_json("POST", url + "/detokenize", {"model": "other", "tokens": ids})
    assert status == 404 and body["error"]["param"] == "model"
    status, body = request_json("POST", url + "/detokenize", {"tokens": [1, info.vocab_size]})
    assert status == 400 and body["error"]["param"] == "tokens[1]", body
    status, body = request_json("POST", url + "/tokenize", {"prompt": "x", "extra": 1})
    assert status == 400 and body["error"]["param"] == "extra"


def test_large_hostile_bodies_do_not_stall_the_gateway(gateway: Service, model: str) -> None:
    """Bodies within --max-body-bytes whose JSON is slow to build (600k object keys: ~0.3 s of
    parsing, 400k nested lists, 65k messages) are parsed in a worker process and refused by size
    before their items are built: a /health prober beside them stays fast (it waited 0.3 s on
    the first before), and each gets its 400 naming the field."""
    url = base_url(gateway)
    worst, stop = [0.0], threading.Event()

    def probe() -> None:
        while not stop.is_set():
            start = time.perf_counter()
            with urllib.request.urlopen(url + "/health", timeout=30) as response:
                response.read()
            worst[0] = max(worst[0], time.perf_counter() - start)
            time.sleep(0.01)

    fields = {
        "logit_bias": {"logit_bias": {str(i): 1 for i in range(600_000)}},
        "allowed_token_ids": {"allowed_token_ids": [1] * 1_000_000},
        "prompt": {"prompt": [[1, 2], [3]] * 200_000},
    }
    # encoded before the prober starts: json.dumps holds this process's GIL (the prober's) too
    bodies = {
        k: json.dumps({"model": "m", "prompt": "hi", **v}).encode() for k, v in fields.items()
    }
    prober = threading.Thread(target=probe)
    prober.start()
    try:
        while worst[0] == 0.0:  # the first probe opens the connections: not counted
            time.sleep(0.01)
        time.sleep(0.5)
        worst[0] = 0.0
        for param, body in bodies.items():
            path = "/v1/chat/completions" if param == "messages" else "/v1/completions"
            status, reply = request_json("POST", url + path, body)
            assert status == 400 and reply["error"]["param"] == param, reply
    finally:
        stop.set()
        prober.join()
    print(f"\nworst /health beside the hostile bodies: {worst[0] * 1000:.0f} ms")
    assert worst[0] < 0.25


def children_of(pid: int) -> list[int]:
    """The live child processes of `pid` (Linux's /proc/PID/task/*/children)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            found += [int(c) for c in (task / "children").read_text().split()]
    return found


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux's /proc")
def test_body_parse_workers_die_with_a_killed_gateway(services: Pair) -> None:
    gateway = start_gateway(services.frontend.address)
    deadline = time.monotonic() + 20
    while len(workers := children_of(gateway.process.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)  # started by the app's start-up, after the socket listens
    assert len(workers) >= 2, "the gateway starts its two body-parse workers at start-up"
    gateway.kill()
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{p}").exists() for p in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in workers if Path(f"/proc/{p}").exists()]


# --- operating it: metrics on --metrics-port, the request log, X-Request-Id ---------------------


@pytest.fixture(scope="module")
def metered(services: Pair) -> Iterator[tuple[Service, int]]:
    """A gateway with --metrics-port, and that port."""
    port = free_port()
    gateway = start_gateway(services.frontend.address, "--metrics-port", str(port))
    yield gateway, port
    assert gateway.stop() == 0, gateway.output()


def http_call(url: str, body: dict, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    """(status, response headers, body) of one POST, errors included."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    for name, value in {"Content-Type": "application/json", **headers}.items():
        request.add_header(name, value)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def request_lines(gateway: Service, request_id: str, timeout: float = 10.0) -> list[str]:
    """The gateway's log lines for `request_id`, once there is one: a request is logged as its
    response ends, a moment after the client read its last byte."""
    deadline = time.monotonic() + timeout
    while True:
        found = [ln for ln in gateway.lines if f"nanoserve.requests: request '{request_id}' " in ln]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def test_metrics_request_log_and_request_ids(
    metered: tuple[Service, int], model: str, services: Pair
) -> None:
    """A completion, a streamed chat and a 400 move the counters by route and status and leave one
    log line each, under the caller's X-Request-Id (which the frontend's line carries too) or,
    for an id past 128 characters, one the gateway made; no token or prompt text is logged."""
    gateway, port = metered
    url, secret, prompt = base_url(gateway), "sk-never-logged", "A zebra named Quillfeather"
    before = scrape(port)
    auth = {"Authorization": f"Bearer {secret}"}
    status, headers, raw = http_call(
        url + "/v1/completions",
        {"model": model, "prompt": prompt, "max_tokens": 5, "ignore_eos": True},
        {**auth, "X-Request-Id": "e2e-completion-1"},
    )
    assert status == 200 and headers["x-request-id"] == "e2e-completion-1"
    usage = json.loads(raw)["usage"]
    status, headers, raw = http_call(
        url + "/v1/chat/completions",
        {
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 6,
            "ignore_eos": True,
            "stream": True,
        },
        {**auth, "X-Request-Id": "e2e-chat-1"},
    )
    assert status == 200 and headers["x-request-id"] == "e2e-chat-1"
    assert raw.endswith(b"data: [DONE]\n\n")
    status, headers, raw = http_call(
        url + "/v1/completions",
        {"model": model, "prompt": prompt, "frobnicate": 1},
        {**auth, "X-Request-Id": "x" * 129},
    )
    made = headers["x-request-id"]
    assert status == 400 and re.fullmatch(r"[0-9a-f]{32}", made), made

    (line,) = request_lines(gateway, "e2e-completion-1")
    assert (
        f"request 'e2e-completion-1' POST /v1/completions 200 finish=length "
        f"prompt={usage['prompt_tokens']} completion=5 ttft=- duration="
    ) in line
    (line,) = request_lines(gateway, "e2e-chat-1")
    assert re.search(
        r"request 'e2e-chat-1' POST /v1/chat/completions 200 finish=length prompt=\d+ "
        r"completion=6 ttft=\d+\.\d{3}s duration=\d+\.\d{3}s peer=127\.0\.0\.1:\d+$",
        line.rstrip(),
    ), line
    (line,) = request_lines(gateway, made)
    assert f"request '{made}' POST /v1/completions 400 finish=- prompt=- completion=-" in line
    assert not [ln for ln in gateway.lines if secret in ln or "Quillfeather" in ln]
    # the id went on as the gRPC request_id: the frontend's own line has it
    assert [ln for ln in services.frontend.lines if "request 'e2e-chat-1' Chat OK" in ln]

    after = scrape(port)

    def delta(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    requests = "nanoserve:gateway_requests_total"
    assert delta(requests, route="/v1/completions", status="200") == 1
    assert delta(requests, route="/v1/completions", status="400") == 1
    assert delta(requests, route="/v1/chat/completions", status="200") == 1
    duration = "nanoserve:gateway_request_duration_seconds"
    assert delta(f"{duration}_count", route="/v1/completions") == 2
    assert delta(f"{duration}_count", route="/v1/chat/completions") == 1
    assert delta(f"{duration}_bucket", route="/v1/chat/completions", le="+Inf") == 1
    assert delta(f"{duration}_sum", route="/v1/chat/completions") > 0
    first_event = "nanoserve:gateway_time_to_first_event_seconds_count"
    assert delta(first_event, route="/v1/chat/completions") == 1
    assert delta(first_event, route="/v1/completions") == 0  # not streamed
    assert delta("nanoserve:gateway_request_body_bytes_count", route="/v1/completions") == 2
    assert delta("nanoserve:gateway_completion_tokens_total", route="/v1/completions") == 5
    assert delta("nanoserve:gateway_completion_tokens_total", route="/v1/chat/completions") == 6
    assert (
        delta("nanoserve:gateway_prompt_tokens_total", route="/v1/completions")
        == usage["prompt_tokens"]
    )
    assert after[("nanoserve:gateway_requests_in_flight", ())] == 0


def test_a_stream_the_client_left_is_logged_499(
    metered: tuple[Service, int], model: str, services: Pair
) -> None:
    gateway, port = metered
    before = scrape(port)
    data = json.dumps(
        {"model": model, "prompt": "Hi", "max_tokens": 3000, "ignore_eos": True, "stream": True}
    ).encode()
    request = urllib.request.Request(base_url(gateway) + "/v1/completions", data=data)
    request.add_header("Content-Type", "application/json")
    request.add_header("X-Request-Id", "e2e-left")
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.readline().startswith(b"data: ")
    (line,) = request_lines(gateway, "e2e-left")
    assert "POST /v1/completions 499 finish=- prompt=- completion=- ttft=" in line
    assert_idle(services.worker.address, timeout=10.0)
    key = ("nanoserve:gateway_requests_total", (("route", "/v1/completions"), ("status", "499")))
    assert scrape(port).get(key, 0.0) - before.get(key, 0.0) == 1
