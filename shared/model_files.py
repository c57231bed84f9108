"""Reads a Hugging Face model directory without torch or tokenizers.

Both services call tokenizer_digest: the worker reports it in GetModelInfo, and the frontend refuses
to serve when its local tokenizer files hash differently.
"""

import hashlib
import json
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
