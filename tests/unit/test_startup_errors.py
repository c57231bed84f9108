"""Startup errors of the services and `nanoserve serve`: each ends in one line naming the cause and
the fix, a non-zero exit and no traceback (the traceback only with --log-level DEBUG). Every case
fails before the model loads, so these run in seconds.
"""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from nanoserve import cli
from nanoserve.cli import serve_args

ROOT = Path(__file__).resolve().parents[2]


def run(*argv: str, cwd: Path = ROOT, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("NANOSERVE_")}
    return subprocess.run(
        [sys.executable, *argv],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=cwd,
        env=clean | env,
    )


def error_lines(done: subprocess.CompletedProcess) -> list[str]:
    """The lines that say something went wrong (stderr, or ERROR log lines on stdout)."""
    logged = [line for line in done.stdout.splitlines() if " ERROR " in line]
    return [*logged, *done.stderr.splitlines()]


def assert_one_line(done: subprocess.CompletedProcess, *needles: str, code: int = 1) -> str:
    lines = error_lines(done)
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    assert len(lines) == 1, lines
    assert "Traceback" not in done.stdout + done.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.fixture
def qwen_dir(tmp_path: Path, tiny_model_dir: Path) -> Path:
    """A copy of the tiny model's config and tokenizer (weights only named: never loaded here)."""
    model = tmp_path / "model"
    model.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_model_dir / name, model / name)
    (model / "model.safetensors").write_bytes(b"")
    return model


def edit_config(model: Path, **changes: object) -> Path:
    config = json.loads((model / "config.json").read_text())
    config.update(changes)
    (model / "config.json").write_text(json.dumps(config))
    return model


def worker(*argv: str) -> subprocess.CompletedProcess:
    return run("-m", "nanoserve.worker", "--device", "cpu", "--port", "0", *argv)


def test_worker_without_model_refuses(tmp_path: Path) -> None:
    done = run("-m", "nanoserve.worker", cwd=tmp_path)
    line = assert_one_line(done, "--model is required", "tiny", code=2)
    assert line.startswith("python -m nanoserve.worker: error:")  # the prog, not __main__.py
    done = run("-m", "nanoserve.frontend", cwd=tmp_path)
    assert_one_line(done, "--model is required", code=2)


def test_worker_busy_port(busy_port: int, qwen_dir: Path) -> None:
    done = run("-m", "nanoserve.worker", "--model", str(qwen_dir), "--port", str(busy_port))
    assert_one_line(done, f"{busy_port}", "already in use", "--port 0")


def test_frontend_busy_port(busy_port: int, qwen_dir: Path) -> None:
    done = run("-m", "nanoserve.frontend", "--model", str(qwen_dir), "--port", str(busy_port))
    assert_one_line(done, f"{busy_port}", "already in use")


def test_worker_empty_model_dir(tmp_path: Path) -> None:
    assert_one_line(worker("--model", str(tmp_path)), "no config.json")


def test_worker_not_a_directory(tmp_path: Path) -> None:
    assert_one_line(worker("--model", str(tmp_path / "nope")), "not a directory", code=2)


def test_worker_non_qwen3_model(qwen_dir: Path) -> None:
    edit_config(qwen_dir, architectures=["LlamaForCausalLM"], model_type="llama")
    assert_one_line(worker("--model", str(qwen_dir)), "not a Qwen3 model", "LlamaForCausalLM")


def test_worker_quantized_checkpoint(qwen_dir: Path) -> None:
    edit_config(qwen_dir, quantization_config={"quant_method": "awq", "bits": 4})
    assert_one_line(worker("--model", str(qwen_dir)), "quantized checkpoint (awq)")


def test_worker_without_weights(qwen_dir: Path) -> None:
    (qwen_dir / "model.safetensors").unlink()
    assert_one_line(worker("--model", str(qwen_dir)), "no *.safetensors")


def test_worker_tp_size_must_divide_heads(qwen_dir: Path) -> None:
    done = worker("--model", str(qwen_dir), "--tensor-parallel-size", "3")  # 4 heads
    assert_one_line(done, "--tensor-parallel-size 3", "4 attention heads")


def test_worker_engine_core_cpus(qwen_dir: Path) -> None:
    done = worker("--model", str(qwen_dir), "--engine-core-cpus", "3-1")
    assert_one_line(done, "engine_core_cpus", "'3-1'", code=2)
    done = worker("--model", str(qwen_dir), "--engine-core-cpus", "8000")  # no such CPU here
    assert_one_line(done, "engine_core_cpus 8000", "no thread may run there")


def test_frontend_without_tokenizer(qwen_dir: Path) -> None:
    (qwen_dir / "tokenizer.json").unlink()
    done = run("-m", "nanoserve.frontend", "--model", str(qwen_dir), "--port", "0")
    assert_one_line(done, "no tokenizer.json")


def test_debug_log_level_adds_the_traceback(tmp_path: Path) -> None:
    done = worker("--model", str(tmp_path), "--log-level", "DEBUG")
    assert done.returncode == 1 and "no config.json" in done.stdout
    assert "Traceback" in done.stdout


# --- nanoserve serve checks everything it can before starting the worker ----------------------


def serve(*argv: str) -> subprocess.CompletedProcess:
    done = run("-m", "nanoserve.cli", "serve", "--device", "cpu", *argv)
    assert "worker listening" not in done.stdout, "the worker was started"
    return done


def test_serve_busy_frontend_port(busy_port: int, qwen_dir: Path) -> None:
    done = serve("--model", str(qwen_dir), "--port", str(busy_port))
    assert_one_line(done, "nanoserve serve: error:", f"--port {busy_port}", "already in use")


def test_serve_engine_core_cpus_it_may_not_use(qwen_dir: Path) -> None:
    done = serve("--model", str(qwen_dir), "--engine-core-cpus", "8000")
    assert_one_line(done, "nanoserve serve: error:", "engine_core_cpus 8000", "no thread may run")


def test_serve_missing_tokenizer(qwen_dir: Path) -> None:
    (qwen_dir / "tokenizer.json").unlink()
    assert_one_line(serve("--model", str(qwen_dir), "--port", "0"), "no tokenizer.json")


def test_serve_bad_frontend_args(qwen_dir: Path) -> None:
    done = serve(
        "--model", str(qwen_dir), "--port", "0", "--frontend-args", "--max-concurrent-requests 0"
    )
    assert_one_line(done, "max_concurrent_requests must be >= 1", code=2)


def test_serve_bad_worker_flag_value(qwen_dir: Path) -> None:
    done = serve("--model", str(qwen_dir), "--port", "0", "--max-num-seqs", "0")
    assert_one_line(done, "max_num_seqs must be >= 1", code=2)


def test_serve_tp_size_must_divide_heads(qwen_dir: Path) -> None:
    done = serve("--model", str(qwen_dir), "--port", "0", "--tensor-parallel-size", "3")
    assert_one_line(done, "4 attention heads")


# --- the flags serve hands to each service ------------------------------------------------------


def test_serve_splits_flags_between_the_services(qwen_dir: Path, monkeypatch) -> None:
    monkeypatch.setattr(serve_args, "check_port_free", lambda *a, **k: None)
    args, worker_argv, frontend_argv = cli.serve_argvs(
        [
            "--model",
            str(qwen_dir),
            "--port",
            "0",
            "--max-num-seqs",
            "8",
            "--no-enforce-eager",
            "--max-concurrent-requests",
            "3",
            "--no-enable-reflection",
            "--log-level",
            "DEBUG",
            "--frontend-args",
            "--tokenizer-threads 2",
        ]
    )
    assert worker_argv == [
        "--model",
        str(qwen_dir),
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--max-num-seqs",
        "8",
        "--no-enforce-eager",
        "--log-level",
        "DEBUG",
    ]
    assert frontend_argv == [
        "--model",
        str(qwen_dir),
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--max-concurrent-requests",
        "3",
        "--no-enable-reflection",
        "--log-level",
        "DEBUG",
        "--tokenizer-threads",
        "2",
    ]
    assert args.model == str(qwen_dir)


def test_serve_gives_each_service_its_metrics_port(qwen_dir: Path, monkeypatch) -> None:
    """Both configs have metrics_port and max_stop_token_ids: `serve` has one flag for the shared
    bound (both services get it) and one port per service (they cannot share one)."""
    monkeypatch.setattr(serve_args, "check_port_free", lambda *a, **k: None)
    _, worker_argv, frontend_argv = cli.serve_argvs(
        [
            "--model",
            str(qwen_dir),
            "--metrics-port",
            "9100",
            "--worker-metrics-port",
            "9101",
            "--max-stop-token-ids",
            "64",
        ]
    )

    def flags(argv: list[str]) -> dict[str, str]:
        return dict(zip(argv[6::2], argv[7::2]))

    assert flags(worker_argv) == {"--max-stop-token-ids": "64", "--metrics-port": "9101"}
    assert flags(frontend_argv) == {"--max-stop-token-ids": "64", "--metrics-port": "9100"}


def test_serve_passes_the_worker_link_tls_to_both_services(qwen_dir: Path, monkeypatch) -> None:
    """Both configs have tls_*: `serve`'s --tls-* are the frontend's public port, --worker-tls-*
    the worker's server side, and the frontend's --worker-tls-ca-file/-client-* its client side."""
    monkeypatch.setattr(serve_args, "check_port_free", lambda *a, **k: None)
    link = [
        "--worker-tls-cert-file", "w.pem", "--worker-tls-key-file", "w.key",
        "--worker-tls-client-ca-file", "ca.pem", "--worker-tls-ca-file", "ca.pem",
        "--worker-tls-client-cert-file", "f.pem", "--worker-tls-client-key-file", "f.key",
    ]  # fmt: skip
    public = ["--tls-cert-file", "pub.pem", "--tls-key-file", "pub.key"]
    _, worker_argv, frontend_argv = cli.serve_argvs(["--model", str(qwen_dir), *link, *public])

    def flags(argv: list[str]) -> dict[str, str]:
        return dict(zip(argv[6::2], argv[7::2]))

    assert flags(worker_argv) == {
        "--tls-cert-file": "w.pem",
        "--tls-key-file": "w.key",
        "--tls-client-ca-file": "ca.pem",
    }
    assert flags(frontend_argv) == {
        "--worker-tls-ca-file": "ca.pem",
        "--worker-tls-client-cert-file": "f.pem",
        "--worker-tls-client-key-file": "f.key",
        "--tls-cert-file": "pub.pem",
        "--tls-key-file": "pub.key",
    }
    with pytest.raises(SystemExit):  # a TLS worker the frontend has no CA for
        cli.serve_argvs(["--model", str(qwen_dir), *link[:4]])


def test_serve_without_model_names_tiny(monkeypatch) -> None:
    monkeypatch.setattr(serve_args, "check_port_free", lambda *a, **k: None)
    _, worker_argv, frontend_argv = cli.serve_argvs([])
    assert worker_argv[:2] == frontend_argv[:2] == ["--model", "tiny"]


def test_serve_help_lists_both_services_flags() -> None:
    done = run("-m", "nanoserve.cli", "serve", "--help")
    assert done.returncode == 0
    out = done.stdout
    assert out.startswith("usage: nanoserve serve")
    for flag in (
        "--max-num-seqs",
        "--tensor-parallel-size",
        "--max-concurrent-requests",
        "--request-timeout-s",
        "--enable-reflection",
        "--frontend-args",
    ):
        assert flag in out, flag
    assert re.search(r"^worker:$", out, re.MULTILINE) and re.search(
        r"^frontend:$", out, re.MULTILINE
    )
    assert "==SUPPRESS==" not in out and "default: default" not in out


def test_version() -> None:
    done = run("-m", "nanoserve.cli", "--version")
    assert done.returncode == 0 and re.fullmatch(r"nanoserve \S+\n", done.stdout), done.stdout


def test_help_prints_each_default_once() -> None:
    out = run("-m", "nanoserve.worker", "--help").stdout
    block = re.sub(r"\s+", " ", out)
    assert block.count("default") == len(re.findall(r"\(default|; default|\bdefault:", block))
    assert "(default: on cuda, off on cpu) (default" not in block
    assert "--decode-lookahead, --no-decode-lookahead" in block  # one boolean flag style


def test_env_variables_are_per_service(tmp_path: Path) -> None:
    code = (
        "from nanoserve.config import parse_config\n"
        "from nanoserve.frontend.config import FrontendConfig\n"
        "from nanoserve.worker.config import WorkerConfig\n"
        "w = parse_config(WorkerConfig, ['--model', 'tiny'])\n"
        "f = parse_config(FrontendConfig, ['--model', 'tiny'])\n"
        "print(w.port, f.port)\n"
    )
    done = run(
        "-c",
        code,
        NANOSERVE_WORKER_PORT="7001",
        NANOSERVE_FRONTEND_PORT="7002",
        NANOSERVE_PORT="7003",
    )
    assert done.stdout.split() == ["7001", "7002"], done.stderr


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has a GPU")
def test_worker_cuda_without_a_gpu(tiny_model_dir: Path) -> None:
    done = worker("--model", str(tiny_model_dir), "--device", "cuda")  # fails while loading
    assert_one_line(done, "no CUDA device")


def test_frontend_sets_no_deadline_of_its_own_by_default() -> None:
    """Calls whose client set no deadline run unbounded unless the operator sets one."""
    from nanoserve.config import parse_config
    from nanoserve.frontend.config import FrontendConfig

    assert parse_config(FrontendConfig, ["--model", "tiny"]).request_timeout_s == 0
    flags = ["--model", "tiny", "--request-timeout-s", "30"]
    assert parse_config(FrontendConfig, flags).request_timeout_s == 30
