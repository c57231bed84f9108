"""Offline API: token ids in, token ids out, no gRPC (`from nanoserve.worker import LLM, SamplingParams`)."""
from dataclasses import dataclass

from tqdm.auto import tqdm

from nanoserve.worker.config import EngineConfig
from nanoserve.worker.engine.llm_engine import LLMEngine
from nanoserve.worker.sampling_params import SamplingParams


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]  # completion ids
    finish_reason: str  # "stop" | "length" | "abort"
    num_cached_tokens: int


class LLM(LLMEngine):
    """`LLM(model_dir, device="cpu", ...)`: keyword arguments are EngineConfig's fields.

    Any thread may build it. Under tensor parallelism a rank that dies makes generate raise
    nanoserve.worker.engine.tp.RankDied (call shutdown() then); the caller's process goes on."""

    def __init__(self, model: str, **kwargs):
        super().__init__(EngineConfig(model=str(model), **kwargs))

    def generate(self, prompts: list[list[int]],
                 sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params] * len(prompts)
        if len(sampling_params) != len(prompts):
            raise ValueError("sampling_params: need one per prompt, or a single one")
        for prompt, sp in zip(prompts, sampling_params):  # validate all before running any
            self.validate(prompt, sp)
        seqs = [self.add_request(p, sp) for p, sp in zip(prompts, sampling_params)]
        with tqdm(total=len(seqs), desc="Generating", disable=not use_tqdm) as bar:
            while not self.is_finished():
                for out in self.step():
                    bar.update(int(out.finished))
        outputs = []
        for s in seqs:
            assert s.finish_reason is not None  # is_finished(): every sequence ended
            outputs.append(RequestOutput(s.request_id, s.token_ids[:s.num_prompt_tokens],
                                         s.completion_token_ids, s.finish_reason.value,
                                         s.num_cached_tokens))
        return outputs
