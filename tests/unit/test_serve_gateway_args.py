"""`nanoserve serve --gateway-port`: the gateway's flags built and checked before anything starts
(serve_args.gateway_argv), its frontend address and TLS added once the frontend listens
(cli.gateway_flags); bad ones end serve in one line."""

import socket
import subprocess
import sys
from pathlib import Path

from nanoserve import cli
from nanoserve.cli import serve_args
from nanoserve.client.args import Connection
from nanoserve.grpc_options import DEFAULT_MAX_MESSAGE_BYTES


def test_gateway_flags_follow_the_frontends(tiny_model_dir: Path, monkeypatch) -> None:
    monkeypatch.setattr(serve_args, "check_port_free", lambda *a, **k: None)
    common = ["--model", str(tiny_model_dir), "--host", "0.0.0.0", "--log-level", "DEBUG"]
    common += ["--log-format", "json"]
    args, _, _ = cli.serve_argvs(
        [*common, "--gateway-port", "8123", "--gateway-args", "--reuse-port --metrics-port 9092"]
    )
    assert args.gateway_argv == [
        *("--host", "0.0.0.0", "--port", "8123", "--log-level", "DEBUG", "--log-format", "json"),
        *("--grace-period-s", "30.0", "--max-message-bytes", str(DEFAULT_MAX_MESSAGE_BYTES)),
        *("--otlp-traces-endpoint", ""),  # the ServiceConfig fields every service gets alike
        *("--reuse-port", "--metrics-port", "9092"),
    ]
    assert args.gateway_scheme == "http"
    tls = "--tls-cert-file gw.pem --tls-key-file gw.key"
    args, _, _ = cli.serve_argvs([*common, "--gateway-port", "8123", "--gateway-args", tls])
    assert args.gateway_scheme == "https"  # serve's hint names the scheme the gateway serves
    args, _, _ = cli.serve_argvs(common)
    assert args.gateway_argv is None  # off unless asked for


def test_one_traces_endpoint_reaches_every_service(tiny_model_dir: Path, monkeypatch) -> None:
    """--otlp-traces-endpoint is given once; the worker, the frontend and the gateway export to it."""
    monkeypatch.setattr(serve_args, "check_port_free", lambda *a, **k: None)
    flag = ["--otlp-traces-endpoint", "127.0.0.1:4317"]
    args, worker, frontend = cli.serve_argvs(
        ["--model", str(tiny_model_dir), "--gateway-port", "0", *flag]
    )
    assert args.worker_config.otlp_traces_endpoint == "127.0.0.1:4317"
    assert args.frontend_config.otlp_traces_endpoint == "127.0.0.1:4317"
    for argv in (worker, frontend, args.gateway_argv):
        assert argv[argv.index(flag[0]) + 1] == flag[1]


def test_the_gateway_reaches_the_frontend_as_serves_probe_does(
    tiny_model_dir: Path, monkeypatch
) -> None:
    monkeypatch.setattr(serve_args, "check_port_free", lambda *a, **k: None)
    args, _, _ = cli.serve_argvs(["--model", str(tiny_model_dir), "--gateway-port", "0"])
    plain = cli.gateway_flags(args, Connection("127.0.0.1:50051"))
    assert plain[-2:] == ["--frontend-address", "127.0.0.1:50051"]
    assert not [flag for flag in plain if flag.startswith("--tls")]
    mutual = Connection("127.0.0.1:50051", "/ca.pem", "/client.pem", "/client.key")
    assert cli.gateway_flags(args, mutual)[-6:] == [
        *("--tls-root-certificates-file", "/ca.pem"),
        *("--tls-client-cert-file", "/client.pem", "--tls-client-key-file", "/client.key"),
    ]


def serve(*argv: str) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, "-m", "nanoserve.cli", "serve", "--device", "cpu", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert "listening" not in done.stdout, "a service was started"
    assert "Traceback" not in done.stdout + done.stderr
    return done


def test_bad_gateway_flags_end_serve_before_it_starts(tiny_model_dir: Path) -> None:
    model = ("--model", str(tiny_model_dir))
    same = serve(*model, "--port", "8123", "--gateway-port", "8123")
    assert same.returncode == 2 and "--gateway-port and --port must differ" in same.stderr
    bad = serve(*model, "--port", "0", "--gateway-port", "0", "--gateway-args", "--log-format xml")
    assert bad.returncode == 2 and "log_format" in bad.stderr, bad.stderr
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        busy = serve(*model, "--port", "0", "--gateway-port", str(port))
    assert busy.returncode == 1, busy.stderr
    assert f"--gateway-port {port}" in busy.stderr and "already in use" in busy.stderr


def test_frontend_processes_default_to_half_the_cores_1_to_8(monkeypatch) -> None:
    for cores, expected in ((None, 1), (1, 1), (2, 1), (4, 2), (16, 8), (128, 8)):
        monkeypatch.setattr(serve_args.os, "cpu_count", lambda c=cores: c)
        assert serve_args.default_frontend_processes() == expected, cores
