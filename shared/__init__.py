"""nanoserve: Qwen3 serving over gRPC. The package root holds what clients import (no torch needed).

`from nanoserve import Client, AsyncClient` talks to a running frontend; `from nanoserve import LLM,
SamplingParams` runs the engine in-process on token ids (LLM pulls in torch, so it is imported lazily).
"""

from importlib import metadata as _metadata
from typing import TYPE_CHECKING, Any

from nanoserve.client import AsyncClient, Chunk, Client, Completion, ModelInfo, Usage
from nanoserve.errors import ServiceError

try:
    __version__ = _metadata.version("nanoserve")
except _metadata.PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"

if TYPE_CHECKING:
    from nanoserve.sampling import SamplingParams
    from nanoserve.worker.llm import LLM


def __getattr__(name: str) -> Any:
    if name == "LLM":
        from nanoserve.worker.llm import LLM

        return LLM
    if name == "SamplingParams":
        from nanoserve.sampling import SamplingParams

        return SamplingParams
    raise AttributeError(f"module 'nanoserve' has no attribute {name!r}")


__all__ = [
    "LLM",
    "AsyncClient",
    "Chunk",
    "Client",
    "Completion",
    "ModelInfo",
    "SamplingParams",
    "ServiceError",
    "Usage",
]
