"""The compose stack started for real (docker-compose.yml + docker-compose.cpu.yml, the tiny model):
every service healthy, as uid 10001, published on loopback only; a Generate, a Chat with a JSON
schema and OpenAI SDK calls served through it; the three /metrics pages answer with the names
docs/operations.md documents; `stop` drains a request in flight and every container exits 0;
`down -v` leaves nothing. The tests share one stack in file order: the last two stop it and remove it."""

import hashlib
import json
import re
import threading
import time
import urllib.request

import jsonschema
import openai

from nanoserve import Client
from tests.compose.conftest import published_port
from tests.compose.stack import ROOT, Stack, docker, leftovers, service_of
from tests.e2e.gateway_process import SCHEMA

SERVICES = {"worker-auth", "worker", "frontend", "gateway"}
USER = "10001"
SECRET = "/home/nanoserve/worker-auth/token"
DRAIN_S = 8.0  # how long the request in flight during `stop` generates for (grace: 30 s)


def frontend_address() -> str:
    return f"127.0.0.1:{published_port('NANOSERVE_FRONTEND_PORT')}"


def by_service(stack: Stack) -> dict[str, dict]:
    containers = {service_of(c): c for c in stack.containers()}
    assert set(containers) == SERVICES, sorted(containers)
    return containers


def test_every_service_is_healthy_on_loopback_as_a_non_root_user(plain: Stack) -> None:
    containers = by_service(plain)
    auth = containers.pop("worker-auth")
    assert (auth["State"]["Status"], auth["State"]["ExitCode"]) == ("exited", 0)
    for name, container in containers.items():
        assert container["State"]["Health"]["Status"] == "healthy", plain.logs(name)
        ids = plain.exec_python(container, "import os; print(os.getuid(), os.getgid())")
        assert ids.split() == [USER, USER], name
    # published: the APIs and the frontend's metrics, on 127.0.0.1 only, on the ports asked for
    ports = {
        name: {
            port: [(b["HostIp"], int(b["HostPort"])) for b in bindings] if bindings else None
            for port, bindings in c["NetworkSettings"]["Ports"].items()
        }
        for name, c in containers.items()
    }
    assert ports == {
        "worker": {"50061/tcp": None, "9091/tcp": None},
        "frontend": {
            "50051/tcp": [("127.0.0.1", published_port("NANOSERVE_FRONTEND_PORT"))],
            "9090/tcp": [("127.0.0.1", published_port("NANOSERVE_FRONTEND_METRICS_PORT"))],
        },
        "gateway": {
            "8000/tcp": [("127.0.0.1", published_port("NANOSERVE_GATEWAY_PORT"))],
            "9092/tcp": None,
        },
    }


def test_worker_and_frontend_share_the_secret_the_one_shot_wrote(plain: Stack) -> None:
    """One random secret, the same in the worker (which requires it) and the frontend (which
    sends it); the gateway has none. Compared by digest: the secret never reaches a log."""
    containers = by_service(plain)
    read = f"import hashlib; print(hashlib.sha256(open({SECRET!r}, 'rb').read()).hexdigest())"
    digests = {
        name: plain.exec_python(containers[name], read).strip() for name in ("worker", "frontend")
    }
    assert len(set(digests.values())) == 1, digests
    assert digests["worker"] != hashlib.sha256(b"").hexdigest()
    assert (
        plain.exec_python(
            containers["gateway"], f"import os; print(os.path.exists({SECRET!r}))"
        ).strip()
        == "False"
    )


def test_generate_through_the_frontend(plain: Stack) -> None:
    with Client(frontend_address(), timeout=60) as client:
        out = client.generate("Hello", max_tokens=16, ignore_eos=True, temperature=0.0)
        assert out.finish_reason == "length" and len(out.token_ids) == 16 and out.text
        assert out.usage.completion_tokens == 16
        assert client.model_info().model_name == "model"  # the worker's directory, /model


def test_chat_with_a_json_schema(plain: Stack) -> None:
    messages = [{"role": "user", "content": "Describe a person as JSON."}]
    with Client(frontend_address(), timeout=120) as client:
        for seed in range(2):
            out = client.chat(
                messages,
                max_tokens=128,
                temperature=1.0,
                seed=seed,
                structured_output={"json_schema": SCHEMA},
            )
            assert out.finish_reason == "stop", out.text
            jsonschema.validate(json.loads(out.text), SCHEMA)


def test_openai_sdk_through_the_gateway(plain: Stack) -> None:
    base_url = f"http://127.0.0.1:{published_port('NANOSERVE_GATEWAY_PORT')}/v1"
    sdk = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=60)
    assert [m.id for m in sdk.models.list().data] == ["model"]
    chat = sdk.chat.completions.create(
        model="model", messages=[{"role": "user", "content": "Hi"}], max_tokens=8
    )
    (choice,) = chat.choices
    assert choice.finish_reason in ("stop", "length") and isinstance(choice.message.content, str)
    assert chat.usage is not None and 1 <= chat.usage.completion_tokens <= 8
    stream = sdk.completions.create(model="model", prompt="Hello", max_tokens=8, stream=True)
    assert "".join(c.choices[0].text for c in stream if c.choices)


def documented_metrics() -> dict[str, set[str]]:
    """docs/operations.md's metric names per service (the bullets of its Metrics section),
    `{a,b}` inside a name expanded, a trailing `{labels}` dropped."""
    text = (ROOT / "docs/operations.md").read_text()
    section = text.split("## Metrics", 1)[1].split("\n## ", 1)[0]
    parts = re.split(r"^(Frontend|Worker|Gateway) ", section, flags=re.MULTILINE)
    names: dict[str, set[str]] = {}
    for service, body in zip(parts[1::2], parts[2::2], strict=True):
        for item in re.findall(r"^- (.+?)(?=^- |^\S|\Z)", body, flags=re.MULTILINE | re.DOTALL):
            for name in re.findall(r"`([a-z0-9_]+:[a-z0-9_{},]+)`", item):
                name = re.sub(r"\{[a-z_,]+\}$", "", name)
                if match := re.search(r"\{([a-z_,]+)\}", name):
                    for option in match.group(1).split(","):
                        names.setdefault(service.lower(), set()).add(
                            name[: match.start()] + option + name[match.end() :]
                        )
                else:
                    names.setdefault(service.lower(), set()).add(name)
    return names


def exposed(page: str) -> set[str]:
    """The metric names a Prometheus page offers: each family, and a counter's `_total` sample."""
    names = set()
    for family, kind in re.findall(r"^# TYPE (\S+) (\w+)$", page, flags=re.MULTILINE):
        names |= {family, family + "_total"} if kind == "counter" else {family}
    return names


def test_metrics_ports_answer_with_the_documented_names(plain: Stack) -> None:
    documented = documented_metrics()
    assert set(documented) == {"frontend", "worker", "gateway"}
    assert all(len(names) >= 5 for names in documented.values()), documented
    containers = by_service(plain)
    port = published_port("NANOSERVE_FRONTEND_METRICS_PORT")
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        pages = {"frontend": reply.read().decode()}
    # the worker's and the gateway's stay on the compose network: read from inside
    pages["worker"] = plain.metrics(containers["worker"], 9091)
    pages["gateway"] = plain.metrics(containers["gateway"], 9092)
    for service, names in documented.items():
        missing = names - exposed(pages[service])
        assert not missing, f"{service} /metrics lacks {sorted(missing)}"
    assert "nanoserve:worker_ready" in pages["worker"]
    assert re.search(r"^vllm:request_success_total\{[^}]*\} [1-9]", pages["frontend"], re.MULTILINE)


def test_stop_drains_a_request_in_flight_and_every_container_exits_0(plain: Stack) -> None:
    """SIGTERM for the stack: a stream started before `stop` still gets every token (the gateway
    stops first, then the frontend drains it, then the worker), and nothing exits non-zero."""
    with Client(frontend_address(), timeout=60) as client:
        began = time.monotonic()
        client.generate("Warm", max_tokens=64, ignore_eos=True, temperature=0.0)
        rate = 64 / (time.monotonic() - began)
    tokens = max(200, min(3500, int(rate * DRAIN_S)))  # long enough to outlast the gateway's stop
    received: list[int] = []
    finish: dict[str, object] = {}

    def stream() -> None:
        with Client(frontend_address(), timeout=120) as client:
            for chunk in client.generate_stream(
                "Once", max_tokens=tokens, ignore_eos=True, temperature=0.0
            ):
                received.extend(chunk.token_ids)
                if chunk.finish_reason:
                    finish["reason"] = chunk.finish_reason
        finish["at"] = time.monotonic()

    thread = threading.Thread(target=stream, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not received and time.monotonic() < deadline:
        time.sleep(0.05)
    assert received, "the stream never started"
    stop_began = time.monotonic()
    plain.stop()
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert finish.get("reason") == "length" and len(received) == tokens, (len(received), finish)
    assert finish["at"] > stop_began  # it was still streaming when `stop` began
    assert re.search(r"draining: [1-9]\d* requests in flight", plain.logs("frontend", tail=200))
    states = {
        service_of(c): (c["State"]["Status"], c["State"]["ExitCode"]) for c in plain.containers()
    }
    assert states == {name: ("exited", 0) for name in SERVICES}, states


def test_down_removes_every_container_network_and_volume(plain: Stack) -> None:
    config = json.loads(plain.compose("config", "--format", "json"))
    plain.down()
    assert leftovers(plain.project) == {"containers": [], "networks": [], "volumes": []}
    networks = {n["name"] for n in config["networks"].values()}
    volumes = {v["name"] for v in config["volumes"].values()}
    assert networks == {"nanoserve"} and volumes == {
        "nanoserve-compile-cache",
        "nanoserve-worker-auth",
    }
    assert not networks & set(docker("network", "ls", "--format", "{{.Name}}").split())
    assert not volumes & set(docker("volume", "ls", "--format", "{{.Name}}").split())
