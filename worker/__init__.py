"""The GPU worker: engine (scheduler, paged KV blocks, model runner, sampler) and its gRPC service."""

from nanoserve.sampling import SamplingParams


def __getattr__(name: str):
    # LLM pulls in torch; importing it lazily keeps `python -m nanoserve.worker --help` and config use light
    if name == "LLM":
        from nanoserve.worker.llm import LLM

        return LLM
    raise AttributeError(name)


__all__ = ["LLM", "SamplingParams"]
