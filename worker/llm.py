"""Offline API, no gRPC (`from nanoserve.worker import LLM, SamplingParams`): prompts as token ids or
as text (encoded with the model's tokenizer.json by nanoserve.prompt_text, loaded on first use)."""

from dataclasses import dataclass
from typing import Any

from nanoserve.worker.config import EngineConfig
from nanoserve.worker.engine.llm_engine import LLMEngine
from nanoserve.worker.sampling_params import SamplingParams
from tqdm.auto import tqdm


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]  # completion ids
    finish_reason: str  # "stop" | "length" | "abort"
    num_cached_tokens: int
    text: str | None = None  # the decoded completion, for a text prompt (None for token ids)


class LLM(LLMEngine):
    """`LLM(model_dir, device="cpu", ...)`: keyword arguments are EngineConfig's fields.

    Any thread may build it. Under tensor parallelism a rank that dies makes generate raise
    nanoserve.worker.engine.tp.RankDied (call shutdown() then); the caller's process goes on."""

    def __init__(self, model: str, **kwargs):
        super().__init__(EngineConfig(model=str(model), **kwargs))
        self._tokenizer: Any = None  # nanoserve.prompt_text's, loaded by the first text prompt

    def _encode(self, prompt: str | list[int]) -> list[int]:
        if not isinstance(prompt, str):
            return prompt
        if self._tokenizer is None:
            from nanoserve.prompt_text import load_prompt_tokenizer  # only text prompts need it

            self._tokenizer = load_prompt_tokenizer(self.config.model)
        return self._tokenizer.encode(prompt)

    def generate(
        self,
        prompts: str | list[str] | list[list[int]],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """One RequestOutput per prompt, in order; a text prompt's output also carries `.text`."""
        if isinstance(prompts, str):
            prompts = [prompts]
        is_text = [isinstance(p, str) for p in prompts]
        prompts = [self._encode(p) for p in prompts]
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params] * len(prompts)
        if len(sampling_params) != len(prompts):
            raise ValueError("sampling_params: need one per prompt, or a single one")
        for prompt, sp in zip(prompts, sampling_params):  # validate all before running any
            self.validate(prompt, sp)
            if sp.structured_output is not None:  # compiled now (ValueError), cached for the run
                self.grammars.check(sp.structured_output)
        seqs = [self.add_request(p, sp) for p, sp in zip(prompts, sampling_params)]
        with tqdm(total=len(seqs), desc="Generating", disable=not use_tqdm) as bar:
            while not self.is_finished():
                for out in self.step():
                    bar.update(int(out.finished))
        outputs = []
        for s, text in zip(seqs, is_text):
            assert s.finish_reason is not None  # is_finished(): every sequence ended
            decoded = None
            if text:
                assert self._tokenizer is not None  # a text prompt loaded it
                decoded = self._tokenizer.decode(s.completion_token_ids)
            outputs.append(
                RequestOutput(
                    s.request_id,
                    s.token_ids[: s.num_prompt_tokens],
                    s.completion_token_ids,
                    s.finish_reason.value,
                    s.num_cached_tokens,
                    decoded,
                )
            )
        return outputs
