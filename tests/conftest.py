"""Shared pytest fixtures: the tiny random Qwen3 model directory and its tokenizer files.

Must import without torch (frontend tests run where torch is absent). Model and tokenizer are built
by nanoserve.tiny.model; the tokenizer is cached under $NANOSERVE_CACHE (default ~/.cache/nanoserve).
"""

from __future__ import annotations

import os
import shutil

# Without a GPU, Triton kernels can only run in its interpreter. TRITON_INTERPRET is read when a kernel
# is decorated, so it must be set before anything imports worker.kernels (nvidia-smi: a cheap probe
# that needs no torch import here).
if shutil.which("nvidia-smi") is None:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import socket
from pathlib import Path

import pytest

from nanoserve.tiny.model import make_tiny_model
from nanoserve.tiny.model import tokenizer_files_dir as _tokenizer_files_dir


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (use: `from tests.conftest import free_port`)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def tokenizer_files_dir() -> Path:
    """Dir holding the cached Qwen tokenizer.json (built once per machine, then reused)."""
    return _tokenizer_files_dir()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A complete tiny Qwen3 model dir with default shapes (float32, tied embeddings, 1 shard).

    Shared by the whole session: treat it as read-only.
    """
    return make_tiny_model(tmp_path_factory.mktemp("tiny-qwen3"))
