"""nanoserve.config: dataclass fields -> flags, env fallback, validation errors as argparse errors."""

import argparse
from dataclasses import dataclass, field

import pytest

from nanoserve.config import add_config_args, config_from_args, parse_config


@dataclass(frozen=True, slots=True)
class DemoConfig:
    """Demo service."""

    model: str = field(default="", metadata={"help": "model directory"})
    max_num_seqs: int = field(default=256, metadata={"help": "max sequences in 100% of a batch"})
    gpu_memory_utilization: float = field(default=0.9, metadata={"help": "fraction"})
    enforce_eager: bool = field(default=False, metadata={"help": "no CUDA graphs"})
    num_kvcache_blocks: int | None = field(default=None, metadata={"help": "blocks"})
    worker_address: str | None = None

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")


@dataclass(frozen=True)
class RequiredConfig:
    port: int


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "MODEL",
        "MAX_NUM_SEQS",
        "GPU_MEMORY_UTILIZATION",
        "ENFORCE_EAGER",
        "NUM_KVCACHE_BLOCKS",
        "WORKER_ADDRESS",
        "PORT",
    ):
        monkeypatch.delenv(f"NANOSERVE_{name}", raising=False)


def test_defaults() -> None:
    assert parse_config(DemoConfig, []) == DemoConfig()


def test_flags_map_to_fields() -> None:
    config = parse_config(
        DemoConfig,
        [
            "--model",
            "/m",
            "--max-num-seqs",
            "8",
            "--gpu-memory-utilization",
            "0.5",
            "--enforce-eager",
            "--num-kvcache-blocks",
            "64",
            "--worker-address",
            "h:1",
        ],
    )
    assert config == DemoConfig("/m", 8, 0.5, True, 64, "h:1")
    assert parse_config(DemoConfig, ["--no-enforce-eager"]).enforce_eager is False


def test_optional_fields_accept_none() -> None:
    config = parse_config(DemoConfig, ["--num-kvcache-blocks", "none", "--worker-address", "None"])
    assert config.num_kvcache_blocks is None and config.worker_address is None


def test_env_fallback_and_flag_precedence(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NANOSERVE_MAX_NUM_SEQS", "32")
    monkeypatch.setenv("NANOSERVE_ENFORCE_EAGER", "true")
    monkeypatch.setenv("NANOSERVE_NUM_KVCACHE_BLOCKS", "12")
    config = parse_config(DemoConfig, [])
    assert (config.max_num_seqs, config.enforce_eager, config.num_kvcache_blocks) == (32, True, 12)
    assert parse_config(DemoConfig, ["--max-num-seqs", "4"]).max_num_seqs == 4
    assert parse_config(DemoConfig, ["--no-enforce-eager"]).enforce_eager is False


def test_bad_env_value_names_the_variable(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setenv("NANOSERVE_MAX_NUM_SEQS", "many")
    with pytest.raises(SystemExit) as exc:
        parse_config(DemoConfig, [])
    assert exc.value.code == 2
    assert "NANOSERVE_MAX_NUM_SEQS" in capsys.readouterr().err


def test_bad_flag_type_is_an_argparse_error(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_config(DemoConfig, ["--max-num-seqs", "x"])
    assert exc.value.code == 2
    assert "--max-num-seqs" in capsys.readouterr().err


def test_post_init_value_error_becomes_clean_error(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_config(DemoConfig, ["--max-num-seqs", "0"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "max_num_seqs must be >= 1, got 0" in err and "Traceback" not in err


def test_help_lists_flags_help_and_env(capsys) -> None:
    with pytest.raises(SystemExit):
        parse_config(DemoConfig, ["--help"])
    out = capsys.readouterr().out
    assert "--max-num-seqs" in out and "max sequences in 100% of a batch" in out
    assert "NANOSERVE_MAX_NUM_SEQS" in out and "--no-enforce-eager" in out
    assert "Demo service." in out


def test_required_field(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SystemExit):
        parse_config(RequiredConfig, [])
    monkeypatch.setenv("NANOSERVE_PORT", "7")
    assert parse_config(RequiredConfig, []).port == 7


def test_add_config_args_composes_with_other_flags() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--verbose", action="store_true")
    add_config_args(parser, DemoConfig)
    namespace = parser.parse_args(["--verbose", "--max-num-seqs", "3"])
    assert namespace.verbose
    assert config_from_args(DemoConfig, namespace).max_num_seqs == 3
    with pytest.raises(ValueError, match="max_num_seqs"):
        config_from_args(DemoConfig, parser.parse_args(["--max-num-seqs", "-1"]))
