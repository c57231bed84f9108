"""`nanoserve serve`'s command line: its flags (the worker's and the frontend's config sections plus
its own), split into the two services' argvs and checked before any process starts. shared.cli runs
the processes.
"""

import argparse
import importlib.util
import os
import shlex
import sys
import traceback
from collections.abc import Sequence

from nanoserve.config import add_config_args, config_argv, parse_config
from nanoserve.frontend.config import FrontendConfig
from nanoserve.model_files import TINY, check_model_dir, check_tokenizer_files, resolve_model_dir
from nanoserve.process import check_port_free
from nanoserve.worker.config import WorkerConfig

SERVE_OWNS = ("model", "host", "port", "worker_address")  # set by `serve` itself, per service
# ServiceConfig fields serve gives all of its services alike (listed in the worker section)
COMMON = ("log_level", "log_format", "grace_period_s", "max_message_bytes", "otlp_traces_endpoint")
# the worker's TLS fields, given to `serve` as --worker-<field> (the frontend's own are --<field>)
WORKER_TLS = ("tls_cert_file", "tls_key_file", "tls_client_ca_file")
# serve's own: how its readiness probe reaches a frontend that serves TLS
PROBE_TLS = ("probe_tls_ca_file", "probe_tls_client_cert_file", "probe_tls_client_key_file")
SERVE_NEEDS = {
    "torch": "worker",
    "safetensors": "worker",
    "tokenizers": "frontend",
    "jinja2": "frontend",
}  # module -> the extra that installs it
GATEWAY_NEEDS = {"fastapi": "gateway", "uvicorn": "gateway"}


def _serve_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nanoserve serve",
        description="Run a worker and a frontend on this machine; Ctrl-C stops both. Worker and "
        "frontend flags are listed below; --log-level, --log-format, --grace-period-s, "
        "--max-message-bytes, --otlp-traces-endpoint and --revision go to every service.",
    )
    parser.add_argument(
        "--model",
        default=TINY,
        help="Hugging Face Qwen3 model directory or hub id (Qwen/Qwen3-0.6B), or `tiny`: the "
        "embedded random-weight test model, whose replies are gibberish (default: tiny)",
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="frontend address to bind (default: 127.0.0.1)"
    )
    parser.add_argument(
        "--port", type=int, default=50051, help="frontend port, 0 = any free (default: 50051)"
    )
    parser.add_argument(
        "--worker-port", type=int, default=0, help="worker port on 127.0.0.1 (default: any free)"
    )
    parser.add_argument(
        "--worker-metrics-port",
        type=int,
        default=0,
        help="worker /metrics port on 127.0.0.1, 0 = off (--metrics-port is the frontend's)",
    )
    for name, what in zip(
        WORKER_TLS,
        (
            "PEM certificate chain: the worker serves TLS (give the frontend --worker-tls-ca-file)",
            "PEM private key of --worker-tls-cert-file",
            "PEM CA bundle: the worker requires a client certificate it signed (mutual TLS: give "
            "the frontend --worker-tls-client-cert-file and --worker-tls-client-key-file)",
        ),
    ):
        parser.add_argument("--worker-" + name.replace("_", "-"), metavar="FILE", help=what)
    for name, what in zip(
        PROBE_TLS,
        (
            (
                "PEM CA bundle serve's readiness probe checks the frontend's --tls-cert-file with "
                "(default: that file itself, so the probe accepts exactly the certificate serve "
                "handed the frontend). It must name --host (127.0.0.1 when --host is a wildcard)"
            ),
            (
                "PEM client certificate of serve's readiness probe, signed by the frontend's "
                "--tls-client-ca-file (needed under mutual TLS: the handshake comes before health)"
            ),
            "PEM private key of --probe-tls-client-cert-file",
        ),
    ):
        parser.add_argument("--" + name.replace("_", "-"), metavar="FILE", help=what)
    parser.add_argument(
        "--frontend-processes",
        type=int,
        default=None,
        metavar="N",
        help="frontend processes sharing --port (SO_REUSEPORT; the kernel spreads connections), "
        "and as many gateway processes sharing --gateway-port: a frontend streams about 12,000 "
        "tokens/s at one message a token, and a client connection lands whole on one of them "
        "(default: half the cores, 1 to 8)",
    )
    parser.add_argument(
        "--demo",
        metavar="PROMPT",
        help="once serving, stream one chat reply to PROMPT to the terminal, then keep serving",
    )
    parser.add_argument(
        "--frontend-args",
        default="",
        help='more frontend flags as one string, e.g. "--max-concurrent-requests 64"',
    )
    parser.add_argument(
        "--gateway-port",
        type=int,
        metavar="PORT",
        help="also run the OpenAI-compatible HTTP gateway on --host:PORT (0 = any free port), in "
        "front of the frontend, reaching it with TLS when the frontend serves it (default: off; "
        "needs the `gateway` extra)",
    )
    parser.add_argument(
        "--gateway-args",
        default="",
        help='more gateway flags as one string, e.g. "--metrics-port 9092 --reuse-port"',
    )
    # metrics_port: the frontend section's; the worker's is --worker-metrics-port
    add_config_args(
        parser,
        WorkerConfig,
        title="worker",
        skip={*SERVE_OWNS, "metrics_port", *WORKER_TLS},
        only_given=True,
    )
    shared = {*COMMON, "revision", "max_stop_token_ids"}  # in the worker section, given to both
    add_config_args(
        parser, FrontendConfig, title="frontend", skip={*SERVE_OWNS, *shared}, only_given=True
    )
    return parser


def default_frontend_processes() -> int:
    """Half the cores, 1 to 8: on the H200 host's 16 cores, 8 frontends (and 8 gateways) carry a
    stand-in worker's 512 streams at ~0.9-1.0 messages a token and 64,000-70,000 tokens/s, where 4
    coalesced to ~0.6 (docs/benchmarks.md); an idle process costs little, and the kernel spreads
    connections better over more processes."""
    return max(1, min(8, (os.cpu_count() or 1) // 2))


def _fields(cls: type) -> set[str]:
    return set(cls.__dataclass_fields__)  # type: ignore[attr-defined]


def serve_argvs(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str], list[str]]:
    """Parses `nanoserve serve` flags into (serve's own, worker argv, frontend argv), and checks
    every input it can before anything starts: flags, model directory, tokenizer files, installed
    extras, ports. A problem ends the command in one line (exit 2 for flags, 1 otherwise).
    `args.frontend_config` is the frontend's FrontendConfig as it will parse it (environment too)."""
    args = _serve_parser().parse_args(argv)
    if args.frontend_processes is None:
        args.frontend_processes = default_frontend_processes()
    elif args.frontend_processes < 1:
        _serve_parser().error(f"--frontend-processes must be >= 1, got {args.frontend_processes}")
    given = vars(args)  # serve's own flags, and only the service flags given on the command line
    worker_values = {k: v for k, v in given.items() if k in _fields(WorkerConfig)}
    frontend_values = {k: v for k, v in given.items() if k in _fields(FrontendConfig)}
    for name in SERVE_OWNS:
        worker_values.pop(name, None)
        frontend_values.pop(name, None)
    worker_values.pop("metrics_port", None)
    if args.worker_metrics_port:
        worker_values["metrics_port"] = args.worker_metrics_port
    for name in WORKER_TLS:  # the namespace's `tls_*` are the frontend's
        worker_values.pop(name, None)
        if getattr(args, "worker_" + name) is not None:
            worker_values[name] = getattr(args, "worker_" + name)
    if args.worker_tls_cert_file and not getattr(args, "worker_tls_ca_file", None):
        _serve_parser().error(
            "--worker-tls-cert-file needs --worker-tls-ca-file: the CA the frontend (and serve's "
            "health probe) checks the worker's certificate with"
        )
    worker_argv = [
        *("--model", args.model, "--host", "127.0.0.1", "--port", str(args.worker_port)),
        *config_argv(worker_values),
    ]
    frontend_argv = [
        *("--model", args.model, "--host", args.host, "--port", str(args.port)),
        *config_argv(frontend_values),
        *shlex.split(args.frontend_args),
    ]
    # Parse both now, as the services will: a bad value fails here, before minutes of loading.
    worker = args.worker_config = parse_config(
        WorkerConfig, worker_argv, prog="nanoserve serve (worker flags)"
    )
    # kept for serve's probes and "try:" hint: the frontend's TLS and api keys as it will see
    # them (flags, --frontend-args and NANOSERVE_FRONTEND_* variables alike)
    frontend = args.frontend_config = parse_config(
        FrontendConfig,
        [*frontend_argv, "--worker-address", "127.0.0.1:1"],
        prog="nanoserve serve (frontend flags)",
    )
    args.gateway_argv = gateway_argv(args) if args.gateway_port is not None else None
    if args.gateway_port and args.gateway_port == args.port:
        _serve_parser().error(f"--gateway-port and --port must differ, both are {args.port}")
    if (args.probe_tls_ca_file or args.probe_tls_client_cert_file) and not frontend.tls_cert_file:
        _serve_parser().error("--probe-tls-* flags need the frontend's --tls-cert-file")
    if (args.probe_tls_client_cert_file is None) != (args.probe_tls_client_key_file is None):
        _serve_parser().error(
            "--probe-tls-client-cert-file and --probe-tls-client-key-file go together"
        )
    if frontend.tls_client_ca_file and not args.probe_tls_client_cert_file:
        _serve_parser().error(
            "--tls-client-ca-file (mutual TLS) needs --probe-tls-client-cert-file and "
            "--probe-tls-client-key-file: serve's readiness probe must present a client "
            "certificate that CA signed"
        )
    needs = {**SERVE_NEEDS, **(GATEWAY_NEEDS if args.gateway_argv is not None else {})}
    missing = sorted({extra for module, extra in needs.items() if not _installed(module)})
    try:
        if missing:
            raise ValueError(
                f"this install has no {' and no '.join(missing)} dependencies (a client-only "
                f"install?): pip install 'nanoserve[all]' to serve"
            )
        model_dir = resolve_model_dir(args.model, worker.revision)  # a hub id: downloads it
        check_model_dir(
            model_dir, worker.tensor_parallel_size, needs_weights=worker.load_format != "dummy"
        )
        check_tokenizer_files(model_dir)
        check_port_free(args.host, args.port)
        check_port_free("127.0.0.1", args.worker_port, flag="--worker-port")
        if args.gateway_port is not None:
            check_port_free(args.host, args.gateway_port, flag="--gateway-port")
        if worker.engine_core_cpus:  # every process serve starts (they inherit it) keeps off them
            from nanoserve.worker.core.cpu_affinity import keep_process_off

            keep_process_off(worker.engine_core_cpus)
    except ValueError as e:
        if worker.log_level.upper() == "DEBUG":
            traceback.print_exc()
        print(f"nanoserve serve: error: {e}", file=sys.stderr)
        sys.exit(1)
    return args, worker_argv, frontend_argv


def gateway_argv(args: argparse.Namespace) -> list[str]:
    """The gateway's flags but --frontend-address and TLS (serve adds them once the frontend
    listens), parsed now as the gateway will parse them: a bad one fails before anything starts."""
    from nanoserve.frontend.gateway.config import GatewayConfig

    frontend: FrontendConfig = args.frontend_config
    argv = [
        *("--host", args.host, "--port", str(args.gateway_port)),
        *config_argv({name: getattr(frontend, name) for name in COMMON}),
        *shlex.split(args.gateway_args),
    ]
    gateway = parse_config(
        GatewayConfig,
        [*argv, "--frontend-address", "127.0.0.1:1"],
        prog="nanoserve serve (gateway flags)",
    )
    args.gateway_metrics_port = gateway.metrics_port  # the first gateway's; the others count up
    args.gateway_scheme = "https" if gateway.tls_cert_file else "http"  # for serve's hint
    return argv


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None
