"""The `nanoserve` console script: `serve` runs a worker and a frontend as child processes on
loopback; `worker` and `frontend` run one service; `generate` streams a completion from a running
frontend; `bench` and `make-tiny-model` hand over to their modules.
"""

import argparse
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from typing import IO

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from nanoserve.client import DEFAULT_ADDRESS, Client
from nanoserve.errors import ServiceError

LISTENING = re.compile(r"(worker|frontend) listening on (\S+):(\d+)")
WORKER_SERVICE = "nanoserve.v1.WorkerService"
FRONTEND_SERVICE = "nanoserve.v1.FrontendService"
STOP_TIMEOUT_S = 40.0  # per child: its own drain grace (30 s by default) plus some slack
PASS_THROUGH = {
    "worker": "run the worker service (python -m nanoserve.worker ARGS)",
    "frontend": "run the frontend service (python -m nanoserve.frontend ARGS)",
    "bench": "run the benchmarks (nanoserve.benchmarks.engine)",
    "make-tiny-model": "write a tiny random Qwen3 model directory (shared.tiny_model)",
}


class Child:
    """A service process whose stdout is copied to ours, watching for its "listening on" line."""

    def __init__(self, name: str, argv: list[str]) -> None:
        self.name = name
        self.address: str | None = None
        self.listening = threading.Event()
        self.process = subprocess.Popen(
            argv, stdout=subprocess.PIPE, text=True, bufsize=1, start_new_session=True
        )  # signals come from us, in order
        threading.Thread(target=self._relay, args=(self.process.stdout,), daemon=True).start()

    def _relay(self, stream: IO[str]) -> None:
        for line in stream:
            sys.stdout.write(line)
            sys.stdout.flush()
            match = LISTENING.search(line)
            if match and match.group(1) == self.name and not self.listening.is_set():
                self.address = f"{match.group(2)}:{match.group(3)}"
                self.listening.set()

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM (the service drains), then SIGKILL after `timeout`; returns the exit code."""
        if self.alive():
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                print(
                    f"nanoserve: {self.name} did not stop in {timeout:.0f} s; killing it",
                    file=sys.stderr,
                )
                self.process.kill()
        return self.process.wait()


def _wait_until(predicate, children: list[Child], stop: threading.Event, what: str) -> bool:
    """Polls predicate() until true; False when a child exited or a stop signal arrived."""
    while not predicate():
        for child in children:
            if not child.alive():
                print(
                    f"nanoserve: {child.name} exited with code {child.process.returncode} "
                    f"while {what}",
                    file=sys.stderr,
                )
                return False
        if stop.wait(0.1):
            return False
    return True


def _serving(address: str, service: str) -> bool:
    with grpc.insecure_channel(address) as channel:
        try:
            response = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=1.0
            )
        except grpc.RpcError:
            return False
    return response.status == health_pb2.HealthCheckResponse.SERVING


def serve(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="nanoserve serve",
        description="Run a worker and a frontend on this machine. Flags not listed here go to the "
        "worker (e.g. --device cpu --max-num-seqs 64; see `nanoserve worker --help`).",
    )
    parser.add_argument(
        "--model",
        help="Hugging Face Qwen3 model directory (default: the embedded tiny random model)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="frontend address to bind")
    parser.add_argument("--port", type=int, default=50051, help="frontend port (0 = any free)")
    parser.add_argument(
        "--worker-port", type=int, default=0, help="worker port on 127.0.0.1 (default: any free)"
    )
    parser.add_argument(
        "--demo",
        metavar="PROMPT",
        help="once serving, stream one chat reply to PROMPT to the terminal, then keep serving",
    )
    parser.add_argument(
        "--frontend-args",
        default="",
        help='extra frontend flags as one string, e.g. "--max-concurrent-requests 64"',
    )
    args, worker_args = parser.parse_known_args(argv)
    model = args.model
    if model is None:
        from nanoserve.tiny_model import default_model_dir  # builds the tiny model on first use

        model = str(default_model_dir())

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    python = [sys.executable, "-m"]
    worker = Child(
        "worker",
        [
            *python,
            "nanoserve.worker",
            "--model",
            model,
            "--host",
            "127.0.0.1",
            "--port",
            str(args.worker_port),
            *worker_args,
        ],
    )
    children = [worker]
    try:
        if not _wait_until(worker.listening.is_set, children, stop, "starting"):
            return 0 if stop.is_set() else 1
        if not _wait_until(
            lambda: _serving(worker.address, WORKER_SERVICE), children, stop, "loading the model"
        ):
            return 0 if stop.is_set() else 1
        frontend = Child(
            "frontend",
            [
                *python,
                "nanoserve.frontend",
                "--model",
                model,
                "--worker-address",
                worker.address,
                "--host",
                args.host,
                "--port",
                str(args.port),
                *shlex.split(args.frontend_args),
            ],
        )
        children.insert(0, frontend)  # stopped first, so in-flight streams drain through it
        if not _wait_until(frontend.listening.is_set, children, stop, "starting"):
            return 0 if stop.is_set() else 1
        if not _wait_until(
            lambda: _serving(frontend.address, FRONTEND_SERVICE),
            children,
            stop,
            "connecting to the worker",
        ):
            return 0 if stop.is_set() else 1
        print(
            f"nanoserve serving {model} on {frontend.address} (worker on {worker.address})",
            flush=True,
        )
        if args.demo:
            host, port = frontend.address.rsplit(":", 1)
            connect = "127.0.0.1" if host in ("0.0.0.0", "::", "[::]") else host
            print(f"> {args.demo}", flush=True)
            generate([args.demo, "--chat", "--no-thinking", "--max-tokens", "48", "--usage",
                      "--address", f"{connect}:{port}"])
        _wait_until(lambda: False, children, stop, "serving")
        return 0 if stop.is_set() else 1
    finally:
        for child in children:
            child.stop()


def generate(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="nanoserve generate", description="Stream a completion from a running frontend."
    )
    parser.add_argument("prompt")
    parser.add_argument("--address", default=DEFAULT_ADDRESS, help="frontend host:port")
    parser.add_argument(
        "--chat",
        action="store_true",
        help="send the prompt as one user message through the chat template",
    )
    parser.add_argument(
        "--no-thinking", action="store_true", help="with --chat: enable_thinking=false (Qwen3)"
    )
    parser.add_argument("--timeout", type=float, default=None, help="deadline in seconds")
    parser.add_argument("--usage", action="store_true", help="print token usage to stderr")
    for name, kind in (
        ("max_tokens", int),
        ("min_tokens", int),
        ("temperature", float),
        ("top_p", float),
        ("top_k", int),
        ("min_p", float),
        ("seed", int),
        ("repetition_penalty", float),
        ("presence_penalty", float),
        ("frequency_penalty", float),
    ):
        parser.add_argument("--" + name.replace("_", "-"), dest=name, type=kind)
    parser.add_argument("--stop", action="append", help="stop string (repeatable)")
    parser.add_argument("--ignore-eos", action="store_true", default=None)
    args = parser.parse_args(argv)
    sampling = {
        k: v
        for k, v in vars(args).items()
        if v is not None
        and k not in ("prompt", "address", "chat", "no_thinking", "timeout", "usage")
    }
    with Client(args.address, timeout=args.timeout) as client:
        try:
            if args.chat:
                stream = client.chat_stream(
                    [("user", args.prompt)],
                    enable_thinking=False if args.no_thinking else None,
                    **sampling,
                )
            else:
                stream = client.generate_stream(args.prompt, **sampling)
            last = None
            for chunk in stream:
                sys.stdout.write(chunk.text)
                sys.stdout.flush()
                last = chunk
        except ServiceError as e:
            print(f"\nerror: {e.code.name}: {e.message}", file=sys.stderr)
            return 1
    print()
    if args.usage and last is not None and last.usage is not None:
        print(
            f"finish_reason={last.finish_reason} prompt_tokens={last.usage.prompt_tokens} "
            f"completion_tokens={last.usage.completion_tokens} "
            f"cached_tokens={last.usage.cached_tokens}",
            file=sys.stderr,
        )
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nanoserve", description=__doc__)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    commands.add_parser("serve", help="run a worker and a frontend on loopback", add_help=False)
    commands.add_parser("generate", help="stream a completion from a frontend", add_help=False)
    for name, help_text in PASS_THROUGH.items():
        commands.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0].startswith("-"):
        _parser().parse_args(argv)  # prints help or the usage error, and exits
        return
    command, rest = argv[0], argv[1:]
    if command in ("worker", "frontend"):
        os.execv(sys.executable, [sys.executable, "-m", f"nanoserve.{command}", *rest])
    elif command == "bench":
        from nanoserve.benchmarks.engine import main as bench_main  # needs torch: imported only here

        bench_main(rest)
    elif command == "make-tiny-model":
        from nanoserve.tiny_model import main as tiny_model_main

        tiny_model_main(rest)
    elif command == "serve":
        sys.exit(serve(rest))
    elif command == "generate":
        sys.exit(generate(rest))
    else:
        _parser().parse_args(argv)


if __name__ == "__main__":
    main()
