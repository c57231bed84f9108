"""Offline API, no gRPC (`from nanoserve.worker import LLM, SamplingParams`): prompts as token ids or
as text (encoded with the model's tokenizer.json by nanoserve.text, loaded on first use)."""

import os
from dataclasses import dataclass, field
from typing import Any

from tqdm.auto import tqdm

from nanoserve.model_files import resolve_model_dir
from nanoserve.sampling import SamplingError, SamplingParams, check_prompt
from nanoserve.worker.config import EngineConfig
from nanoserve.worker.core.llm_engine import LLMEngine
from nanoserve.worker.sequence import Sequence


@dataclass(slots=True)
class CompletionOutput:
    """One of a request's n completions (SamplingParams.n)."""

    index: int
    token_ids: list[int]
    finish_reason: str
    text: str | None = None
    logprobs: list[list] | None = None  # as RequestOutput.logprobs, for this completion


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]  # completion ids (of completion 0 when n > 1)
    finish_reason: str  # "stop" | "length" | "abort"
    num_cached_tokens: int
    text: str | None = None  # the decoded completion, for a text prompt (None for token ids)
    outputs: list[CompletionOutput] = field(default_factory=list)  # all n, by index
    # per completion token / prompt position 1..n-1: [token_id, logprob, rank, top_ids,
    # top_logprobs] (worker.runner.logprobs); None unless sampling_params asked
    logprobs: list[list] | None = None
    prompt_logprobs: list[list] | None = None


class LLM(LLMEngine):
    """`LLM(model, device="cpu", ...)`: keyword arguments are EngineConfig's fields. `model` is
    what the worker's --model takes: a directory, a Hugging Face id (its cached snapshot, fetched
    when missing; `revision=` picks one) or `tiny`, the embedded random model.

    Any thread may build it. Under tensor parallelism a rank that dies makes generate raise
    nanoserve.worker.tp.runner.RankDied (call shutdown() then); the caller's process goes on."""

    def __init__(self, model: str | os.PathLike, revision: str | None = None, **kwargs):
        model_dir = resolve_model_dir(os.fspath(model), revision)
        super().__init__(EngineConfig(model=model_dir, **kwargs))
        self._tokenizer: Any = None  # nanoserve.text's Tokenizer, loaded by the first text prompt

    def _encode(self, prompt: str | list[int]) -> list[int]:
        if not isinstance(prompt, str):
            return prompt
        if self._tokenizer is None:
            from nanoserve.text import load_prompt_tokenizer  # only text prompts need it

            self._tokenizer = load_prompt_tokenizer(self.config.model)
        return self._tokenizer.encode(prompt)

    def check(self, token_ids: list[int], sp: SamplingParams) -> None:
        """The offline door: SamplingError (a ValueError) naming the field of a request that can
        never run here. Stop strings need the frontend's detokenizer."""
        if sp.stop or sp.include_stop_str_in_output:
            raise SamplingError("stop", "stop strings need the frontend; use stop_token_ids")
        limits = self.limits
        check_prompt(token_ids, limits)
        sp.check(limits, len(token_ids))

    def add_request(
        self,
        token_ids: list[int],
        sampling_params: SamplingParams,
        request_id: str | int | None = None,
        cache_salt: str | None = None,
        priority: int = 0,
    ) -> Sequence:
        """LLMEngine.add_request behind the offline door (check)."""
        self.check(token_ids, sampling_params)
        return super().add_request(token_ids, sampling_params, request_id, cache_salt, priority)

    def generate(
        self,
        prompts: str | list[str] | list[list[int]],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        use_tqdm: bool = True,
        priority: list[int] | None = None,
    ) -> list[RequestOutput]:
        """One RequestOutput per prompt, in order; a text prompt's output also carries `.text`.
        priority: one per prompt, lower served first (default 0)."""
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
        if priority is None:
            priority = [0] * len(prompts)
        if len(priority) != len(prompts):
            raise ValueError("priority: need one per prompt")
        for prompt, sp in zip(prompts, sampling_params):  # check all before running any
            self.check(prompt, sp)
            if sp.structured_output is not None:  # compiled now (ValueError), cached for the run
                self.grammars.check(sp.structured_output)
        seqs = [
            super(LLM, self).add_request(p, sp, priority=pr)
            for p, sp, pr in zip(prompts, sampling_params, priority)
        ]
        logprobs: dict[int, list] = {}  # seq_id -> its entries (forks included)
        prompt_logprobs: dict[int, list] = {}
        with tqdm(total=len(seqs), desc="Generating", disable=not use_tqdm) as bar:
            while not self.is_finished():
                for out in self.step():
                    bar.update(int(out.finished))
                    if out.logprobs:
                        logprobs.setdefault(out.seq.seq_id, []).extend(out.logprobs)
                    if out.prompt_logprobs:
                        prompt_logprobs.setdefault(out.seq.seq_id, []).extend(out.prompt_logprobs)
        outputs = []
        for s, text in zip(seqs, is_text):
            completions = [self._completion(c, text, logprobs) for c in s.group or (s,)]
            first = completions[0]
            outputs.append(
                RequestOutput(
                    str(s.request_id),
                    s.token_ids[: s.num_prompt_tokens],
                    first.token_ids,
                    first.finish_reason,
                    s.num_cached_tokens,
                    first.text,
                    sorted(completions, key=lambda c: c.index),
                    first.logprobs,
                    prompt_logprobs.get(
                        s.seq_id, [] if s.sampling_params.prompt_logprobs is not None else None
                    ),
                )
            )
        return outputs

    def _completion(self, seq, text: bool, logprobs: dict[int, list]) -> CompletionOutput:
        assert seq.finish_reason is not None  # is_finished(): every sequence ended
        decoded = None
        sp = seq.sampling_params
        if text and sp.detokenize:
            assert self._tokenizer is not None  # a text prompt loaded it
            decoded = self._tokenizer.decode(seq.completion_token_ids, sp.skip_special_tokens)
        asked = sp.logprobs is not None
        return CompletionOutput(
            seq.index,
            seq.completion_token_ids,
            seq.finish_reason.value,
            decoded,
            logprobs.get(seq.seq_id, [] if asked else None),
        )
