"""The `nanoserve` console script: `serve` runs a worker and a frontend (with --gateway-port the
OpenAI gateway too) as child processes (its flags: nanoserve.cli.serve_args); `worker`, `frontend` and
`gateway` (OpenAI HTTP API) run one service; `generate` (nanoserve.cli.generate), `tokenize` and
`detokenize` (nanoserve.cli.tokens) call a running frontend; `bench` and `make-tiny-model` hand over
to their modules.
"""

import argparse
import os
import secrets
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Sequence

import nanoserve
from nanoserve.cli.generate import generate
from nanoserve.cli.serve_args import serve_argvs
from nanoserve.cli.tokens import detokenize, tokenize
from nanoserve.client.args import Connection
from nanoserve.frontend.config import FrontendConfig
from nanoserve.process import (
    FRONTEND_SERVICE,
    WORKER_SERVICE,
    Child,
    is_serving,
    wait_until,
)
from nanoserve.security import channel_credentials, load_api_keys

# Child, the service names and the health probe moved to nanoserve.process; this keeps
# `from nanoserve.cli import Child, _serving` working until every caller imports nanoserve.process.
_serving = is_serving

PASS_THROUGH = {
    "worker": "run the worker service (python -m nanoserve.worker ARGS)",
    "frontend": "run the frontend service (python -m nanoserve.frontend ARGS)",
    "gateway": "run the OpenAI-compatible HTTP gateway (python -m nanoserve.frontend.gateway ARGS)",
    "bench": "run the benchmarks (nanoserve.benchmarks.engine)",
    "make-tiny-model": "write a tiny random Qwen3 model directory (nanoserve.tiny.model)",
}


def link_secret(args: argparse.Namespace, worker_argv: list[str], frontend_argv: list[str]) -> str:
    """The worker link's secret: the worker's --auth-token-file when one is given (the frontend is
    handed it unless it has its own), else a random one for this run, in a file only this user can
    read, in a private directory that serve removes on exit (returned; "" when none was made)."""
    token_file = args.worker_config.auth_token_file
    made = ""
    if token_file is None:
        made = tempfile.mkdtemp(prefix="nanoserve-serve-")  # mode 0700
        token_file = os.path.join(made, "worker-token")
        fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(32) + "\n")
        worker_argv += ["--auth-token-file", token_file]
    if args.frontend_config.worker_auth_token_file is None:
        frontend_argv += ["--worker-auth-token-file", token_file]
    return made


def serve(argv: Sequence[str]) -> int:
    args, worker_argv, frontend_argv = serve_argvs(argv)
    # the worker answers only its frontend: a per-run secret unless one is given (issue 32)
    secret_dir = link_secret(args, worker_argv, frontend_argv)
    try:
        return _serve(args, worker_argv, frontend_argv)
    finally:
        if secret_dir:
            shutil.rmtree(secret_dir, ignore_errors=True)


def _serve(args: argparse.Namespace, worker_argv: list[str], frontend_argv: list[str]) -> int:
    config: FrontendConfig = args.frontend_config  # flags and environment: what the frontend sees
    # the worker's health, probed as the frontend connects: over TLS when the link uses it
    link = channel_credentials(
        config.worker_tls_ca_file,
        config.worker_tls_client_cert_file,
        config.worker_tls_client_key_file,
    )
    # the frontend's health: over TLS when it serves TLS, trusting --probe-tls-ca-file or else
    # exactly the certificate serve handed it (gRPC accepts a trusted leaf: a pin, no CA needed)
    tls_cert = config.tls_cert_file
    probe = (
        channel_credentials(
            args.probe_tls_ca_file or tls_cert,
            args.probe_tls_client_cert_file,
            args.probe_tls_client_key_file,
        )
        if tls_cert
        else None
    )
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    python = [sys.executable, "-m"]
    worker = Child("worker", [*python, "nanoserve.worker", *worker_argv])
    children = [worker]
    try:
        if not wait_until(worker.listening.is_set, children, stop, "starting"):
            return 0 if stop.is_set() else 1
        if not wait_until(
            lambda: is_serving(worker.address, WORKER_SERVICE, link),
            children,
            stop,
            "loading the model",
        ):
            return 0 if stop.is_set() else 1
        assert worker.address is not None
        frontend = start_replicas(
            "frontend",
            [*python, "nanoserve.frontend", *frontend_argv, "--worker-address", worker.address],
            args.frontend_processes,
            config.metrics_port,
            children,
            stop,
        )
        if frontend is None:
            return 0 if stop.is_set() else 1
        if not wait_until(
            lambda: is_serving(probe_address(frontend.address), FRONTEND_SERVICE, probe),
            children,
            stop,
            "connecting to the worker",
        ):
            return 0 if stop.is_set() else 1
        assert frontend.address is not None
        host, port = frontend.address.rsplit(":", 1)
        connect = "127.0.0.1" if host in ("0.0.0.0", "::", "[::]") else host
        connection = hint_connection(f"{connect}:{port}", config, args)
        openai = ""
        if args.gateway_argv is not None:
            gateway = start_replicas(
                "gateway",
                [*python, "nanoserve.frontend.gateway", *gateway_flags(args, connection)],
                args.frontend_processes,
                args.gateway_metrics_port,
                children,
                stop,
            )
            if gateway is None:
                return 0 if stop.is_set() else 1
            scheme, address = args.gateway_scheme, probe_address(gateway.address)
            openai = f"\n  openai: {scheme}://{address}/v1 (the gateway)"
        print(
            f"nanoserve serving {args.model} on {frontend.address} (worker on {worker.address})\n"
            f"  stop: Ctrl-C (or SIGTERM to pid {os.getpid()}); in-flight requests finish first\n"
            f"  try:  {connection.command()}\n"
            f"  or:   {connection.python()}"
            + (
                "\n        (KEY: one of the api keys the frontend accepts)"
                if connection.needs_token
                else ""
            )
            + openai,
            flush=True,
        )
        if args.demo:
            print(f"> {args.demo}", flush=True)
            keys = load_api_keys(config.api_keys_file, config.api_keys)
            # the demo runs in this process: its token travels in no process's command line
            token = ["--token", next(iter(keys)).decode()] if keys else []
            generate(
                [
                    args.demo,
                    *("--chat", "--no-thinking", "--max-tokens", "48", "--usage"),
                    *connection.flags(),
                    *token,
                ]
            )
        wait_until(lambda: False, children, stop, "serving")
        return 0 if stop.is_set() else 1
    finally:
        for child in children:
            child.stop()


def hint_connection(address: str, config: FrontendConfig, args: argparse.Namespace) -> Connection:
    """How a client reaches the frontend serve started: the CA its probe trusts (--probe-tls-ca-file,
    else the frontend's own certificate), the probe's client certificate under mutual TLS (the CA
    signed it), and whether api keys are set (flags or environment: the parsed config says)."""

    def path(name: str | None) -> str | None:  # absolute: the hint works from any directory
        return os.path.abspath(name) if name else None

    tls, mutual = config.tls_cert_file is not None, config.tls_client_ca_file is not None
    return Connection(
        address,
        ca_file=path(args.probe_tls_ca_file or config.tls_cert_file) if tls else None,
        client_cert_file=path(args.probe_tls_client_cert_file) if mutual else None,
        client_key_file=path(args.probe_tls_client_key_file) if mutual else None,
        needs_token=bool(config.api_keys_file or config.api_keys),
    )


def start_replicas(
    name: str,
    argv: list[str],
    count: int,
    metrics_port: int,
    children: list[Child],
    stop: threading.Event,
) -> Child | None:
    """`count` processes of one service on one port (SO_REUSEPORT when several): the first binds
    argv's port (0: any free one), the others the port it got; process i > 0 serves /metrics on
    metrics_port + i when metrics are on. Each goes first in `children` (stopped first: streams
    drain through the services behind it). The first, once all listen; None if one exited or a
    stop came."""
    shared = ["--reuse-port"] if count > 1 else []
    first = Child(name, [*argv, *shared])
    children.insert(0, first)
    if not wait_until(first.listening.is_set, children, stop, "starting"):
        return None
    assert first.address is not None
    port = first.address.rsplit(":", 1)[1]
    for i in range(1, count):
        metrics = ["--metrics-port", str(metrics_port + i)] if metrics_port else []
        child = Child(name, [*argv, *shared, "--port", port, *metrics])
        children.insert(0, child)
        if not wait_until(child.listening.is_set, children, stop, "starting"):
            return None
    return first


def gateway_flags(args: argparse.Namespace, frontend: Connection) -> list[str]:
    """The gateway's argv: serve's gateway flags, the frontend's address, and TLS as serve's own
    probe reaches the frontend (its CA; its client certificate under mutual TLS)."""
    argv = [*args.gateway_argv, "--frontend-address", frontend.address]
    for flag, path in (
        ("--tls-root-certificates-file", frontend.ca_file),
        ("--tls-client-cert-file", frontend.client_cert_file),
        ("--tls-client-key-file", frontend.client_key_file),
    ):
        if path is not None:
            argv += [flag, path]
    return argv


def probe_address(address: str | None) -> str | None:
    """host:port to dial for a service bound to `address`: loopback for a wildcard host."""
    if address is None:
        return None
    host, port = address.rsplit(":", 1)
    return f"127.0.0.1:{port}" if host in ("0.0.0.0", "::", "[::]") else address


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nanoserve", description=__doc__)
    parser.add_argument("--version", action="version", version=f"nanoserve {nanoserve.__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    commands.add_parser("serve", help="run a worker and a frontend on loopback", add_help=False)
    commands.add_parser("generate", help="stream a completion from a frontend", add_help=False)
    commands.add_parser("tokenize", help="token ids of a text, from a frontend", add_help=False)
    commands.add_parser("detokenize", help="text of token ids, from a frontend", add_help=False)
    for name, help_text in PASS_THROUGH.items():
        commands.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0].startswith("-"):
        _parser().parse_args(argv)  # prints help or the usage error, and exits
        return
    command, rest = argv[0], argv[1:]
    if command == "worker":
        from nanoserve.worker.__main__ import main as worker_main

        worker_main(rest, prog="nanoserve worker")
    elif command == "frontend":
        from nanoserve.frontend.__main__ import main as frontend_main

        frontend_main(rest, prog="nanoserve frontend")
    elif command == "gateway":
        from nanoserve.frontend.gateway.__main__ import main as gateway_main

        gateway_main(rest, prog="nanoserve gateway")
    elif command == "bench":
        from nanoserve.benchmarks.engine import (
            main as bench_main,
        )  # needs torch: imported only here

        bench_main(rest)
    elif command == "make-tiny-model":
        from nanoserve.tiny.model import main as tiny_model_main  # the `tiny` extra

        tiny_model_main(rest)
    elif command == "serve":
        sys.exit(serve(rest))
    elif command == "generate":
        sys.exit(generate(rest))
    elif command == "tokenize":
        sys.exit(tokenize(rest))
    elif command == "detokenize":
        sys.exit(detokenize(rest))
    else:
        _parser().parse_args(argv)
