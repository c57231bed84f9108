"""Reads a Hugging Face model directory without torch or tokenizers: what `--model` names
(resolve_model_dir), whether a service can use it (check_model_dir, check_tokenizer_files), and
the tokenizer digest the worker reports in GetModelInfo and the frontend compares with its own.
"""

import hashlib
import json
import re
from pathlib import Path
from typing import Any

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def read_json(path: str | Path) -> dict[str, Any]:
    """Parses a JSON file; a missing file or a top level that is not an object raises ValueError."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: invalid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object at the top level")
    return data


def tokenizer_digest(model_dir: str | Path) -> str:
    """sha256 hex over the bytes of tokenizer.json then tokenizer_config.json; a missing file
    contributes nothing (so a directory with neither gives the digest of the empty string)."""
    digest = hashlib.sha256()
    for name in TOKENIZER_FILES:
        path = Path(model_dir) / name
        if path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()


# `--model tiny`: the embedded random-weight model (nanoserve.tiny), built on first use.
TINY = "tiny"
MODEL_HELP = (
    "Hugging Face Qwen3 model directory or hub id (Qwen/Qwen3-0.6B: read from the Hugging Face "
    "cache, downloaded when missing unless HF_HUB_OFFLINE=1), or `tiny` for the embedded "
    "random-weight test model (its replies are gibberish)"
)
REVISION_HELP = "branch, tag or commit of a hub id --model (default: main)"
# The files a service reads from a hub snapshot: configs, weights, tokenizer.
HUB_FILES = ["*.json", "*.safetensors", "*.jinja", "*.txt"]
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def is_hub_id(model: str) -> bool:
    """`Qwen/Qwen3-0.6B`: an organisation and a name, not a path that exists."""
    return bool(_HUB_ID.fullmatch(model)) and not Path(model).exists()


def check_model_name(model: str) -> None:
    """What a config accepts as `--model` before anything is read: `tiny`, a directory, a hub id."""
    if model != TINY and not Path(model).is_dir() and not is_hub_id(model):
        raise ValueError(
            f"model: {model!r} is not a directory (nor a Hugging Face id like Qwen/Qwen3-0.6B)"
        )


def resolve_model_dir(model: str, revision: str | None = None) -> str:
    """The directory to load for `--model`: `tiny` builds (once per machine) and names the embedded
    model; a hub id names its snapshot in the Hugging Face cache (downloaded when missing, unless
    HF_HUB_OFFLINE=1); a directory is itself. Raises ValueError with the fix in the message."""
    if model == TINY:
        try:
            from nanoserve.tiny.model import default_model_dir  # only a `tiny` run imports it
        except ImportError as e:
            raise ValueError(
                f"--model tiny needs the `tiny` extra ({e}): pip install 'nanoserve[tiny]'"
            ) from None
        return str(default_model_dir())
    if Path(model).is_dir():
        return model
    if is_hub_id(model):
        return _hub_snapshot(model, revision)
    raise ValueError(f"--model {model}: not a directory (nor a Hugging Face id)")


def _hub_snapshot(repo_id: str, revision: str | None) -> str:
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise ValueError(
            f"--model {repo_id}: a Hugging Face id needs huggingface_hub: "
            "pip install 'nanoserve[worker]' (or pass a model directory)"
        ) from None
    at = f"@{revision}" if revision else ""
    try:
        return snapshot_download(repo_id, revision=revision, allow_patterns=HUB_FILES)
    except FileNotFoundError:  # huggingface_hub's LocalEntryNotFoundError: offline, not cached
        raise ValueError(
            f"--model {repo_id}{at}: not in the Hugging Face cache and offline (HF_HUB_OFFLINE or "
            f"no network); download it where there is network (hf download {repo_id}) and copy "
            "the cache, or pass a model directory"
        ) from None
    except Exception as e:  # noqa: BLE001 - unknown repository or revision, gated model, network error
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(
            f"--model {repo_id}{at}: cannot fetch it from the hub ({reason})"
        ) from None


def check_model_dir(
    model_dir: str | Path, tensor_parallel_size: int = 1, needs_weights: bool = True
) -> None:
    """Refuses, in one line, a directory the worker could not serve: no config.json, not Qwen3, a
    quantized checkpoint, no safetensors weights (unless `needs_weights` is False: random weights,
    load_format=dummy), or attention heads that `tensor_parallel_size` ranks cannot split.
    Reads only JSON and file names (no torch), so it runs before anything slow."""
    path = Path(model_dir)
    if not (path / "config.json").is_file():
        raise ValueError(
            f"--model {path}: no config.json (expected a Hugging Face Qwen3 model directory)"
        )
    config = read_json(path / "config.json")
    architectures = config.get("architectures") or []
    if "Qwen3ForCausalLM" not in architectures and not (
        not architectures and config.get("model_type") == "qwen3"
    ):
        found = ", ".join(map(str, architectures)) or config.get("model_type") or "unknown"
        raise ValueError(
            f"--model {path}: not a Qwen3 model ({found}); nanoserve serves Qwen3 only"
        )
    quantization = config.get("quantization_config")
    if quantization:
        method = quantization.get("quant_method", "?") if isinstance(quantization, dict) else "?"
        raise ValueError(
            f"--model {path}: a quantized checkpoint ({method}); nanoserve runs unquantized "
            "float32/bfloat16/float16 weights only"
        )
    if needs_weights and not any(path.glob("*.safetensors")):
        raise ValueError(f"--model {path}: no *.safetensors weights in the directory")
    heads = config.get("num_attention_heads")
    kv_heads = config.get("num_key_value_heads") or heads
    tp = tensor_parallel_size
    if isinstance(heads, int) and heads % tp:
        raise ValueError(
            f"--tensor-parallel-size {tp} does not divide the model's {heads} attention heads"
        )
    if isinstance(kv_heads, int) and kv_heads % tp and tp % kv_heads:
        raise ValueError(
            f"--tensor-parallel-size {tp} and the model's {kv_heads} KV heads must divide one "
            "another"
        )


def check_tokenizer_files(model_dir: str | Path) -> None:
    """The frontend needs the model's tokenizer.json; refuse in one line when it is missing."""
    if not (Path(model_dir) / "tokenizer.json").is_file():
        raise ValueError(
            f"--model {model_dir}: no tokenizer.json (the frontend tokenizes with the model's "
            "Hugging Face tokenizer files)"
        )
