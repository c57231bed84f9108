"""Logprobs of sampled and prompt tokens, computed on the device from the logits a step already has.

ModelRunner.run asks StepLogprobs.compute after sampling: output rows whose request set `logprobs`
(raw logits, or the sampler's processed ones) and the extra prompt rows a prefill step computed for
requests that set `prompt_logprobs` (PromptRows). Prompt rows never exist as one (P, vocab) tensor:
ModelRunner.execute runs their LM head PROMPT_CHUNK_ROWS rows at a time and PromptLogprobs packs
each chunk as it comes. Each becomes one packed float32 tensor, copied to the host with the sampled
ids and unpacked into entries [token_id, logprob, rank, top_ids, top_logprobs] on the Sequences;
LLMEngine hands them out with the ids. A step where no row asks costs one pass over the
sequences' parameters on the host and nothing on the device.
"""

from dataclasses import dataclass

import numpy as np
import torch

from nanoserve.worker.runner.host_copy import to_device
from nanoserve.worker.runner.sampler import SamplingTensors, processed_logits
from nanoserve.worker.sequence import Sequence

# Prompt-logprob rows go through the LM head and the reduction this many at a time, so a step's
# extra memory is bounded whatever its prompt length (a whole 8k-token chunk of Qwen3 would hold
# 8192 x 151936 logits: 2.5 GB in bf16, 5 GB more in float32). One chunk's peak is
# prompt_chunk_bytes() (256 rows of Qwen3's vocab: ~0.5 GB); the KV-cache warm-up runs one
# (worker.runner.kv_cache), so the cache leaves room for it.
PROMPT_CHUNK_ROWS = 256


def prompt_chunk_bytes(rows: int, vocab: int, dtype: torch.dtype) -> int:
    """Peak bytes of one prompt chunk: its logits (dtype; under tensor parallelism the gathered
    copy and the rank's shard, at most twice), their float32 copy, its float32 log_softmax and
    pack()'s (rows, vocab) comparison mask (1 byte). 256 x 151936 x (2 x 2 + 4 + 4 + 1) B = 0.51 GB
    at worst in bf16; topk's (rows, k) outputs are noise."""
    return rows * vocab * (2 * dtype.itemsize + 4 + 4 + 1)


Entry = list  # [token_id, logprob, rank, top_ids, top_logprobs]


def pack(logprobs: torch.Tensor, token_ids: torch.Tensor, k: int) -> torch.Tensor:
    """logprobs (R, V) float32, token_ids (R,) -> (R, 2 + 2k) float32 rows of [logprob, rank,
    k top logprobs, k top ids] (ids and ranks < 2^24 are exact in float32)."""
    chosen = logprobs.gather(1, token_ids[:, None].long())
    rank = (logprobs > chosen).sum(dim=1, keepdim=True) + 1  # ties rank with the chosen token
    top = logprobs.topk(k, dim=1)
    return torch.cat([chosen, rank.float(), top.values, top.indices.float()], dim=1)


def unpack(host: np.ndarray, token_ids: list[int], ks: list[int]) -> list[Entry]:
    """Rows of pack() (their k = the batch's largest) -> one entry per row, with that row's k."""
    width = (host.shape[1] - 2) // 2
    entries = []
    for row, token_id, k in zip(host.tolist(), token_ids, ks):
        entries.append(
            [
                token_id,
                row[0],
                int(row[1]),
                [int(t) for t in row[2 + width : 2 + width + k]],
                row[2 : 2 + k],
            ]
        )
    return entries


@dataclass(slots=True)
class PromptRows:
    """A prefill step's prompt-logprob positions (worker.runner.prepare): the last P of its logit
    rows, sequence after sequence."""

    seqs: list[Sequence]  # the sequences with prompt positions in this step
    counts: list[int]  # how many positions each has here
    targets: np.ndarray  # (P,) the prompt token each position predicts

    @property
    def k(self) -> int:
        return max(seq.sampling_params.prompt_logprobs or 0 for seq in self.seqs)


class PromptLogprobs:
    """Packs a step's prompt rows chunk by chunk, as ModelRunner.execute computes their logits:
    (P, 2 + 2k) float32 in the end, no (P, vocab) tensor ever."""

    def __init__(self, rows: PromptRows, device: torch.device) -> None:
        self.rows = rows
        self.targets = to_device(rows.targets, device)
        self.packed = torch.empty(
            len(rows.targets), 2 + 2 * rows.k, device=device, dtype=torch.float32
        )

    def add(self, start: int, logits: torch.Tensor) -> None:
        """logits (C, V): the prompt rows start .. start + C."""
        end = start + logits.shape[0]
        logprobs = logits.float().log_softmax(dim=-1)
        self.packed[start:end] = pack(logprobs, self.targets[start:end], self.rows.k)


class StepLogprobs:
    """The logprobs one step computes: device tensors, then host entries on the sequences."""

    def __init__(self) -> None:
        self.out: torch.Tensor | None = None  # packed output rows (on the host once copied)
        self.out_seqs: list[Sequence] = []
        self.out_rows: list[int] = []  # their rows among the sampled ids
        self.prompt: torch.Tensor | None = None
        self.prompt_rows: PromptRows | None = None

    @classmethod
    def compute(
        cls,
        logits: torch.Tensor,
        ids: torch.Tensor,
        seqs: list[Sequence],
        t: SamplingTensors | None,
        prompt: PromptLogprobs | None = None,
    ) -> "StepLogprobs | None":
        """logits (B, V) the sampled rows' (ids (B,)), seqs the B sequences that sampled (t their
        sampling tensors; None when B = 0); prompt: the step's prompt rows, packed. None when
        nothing is asked (no device work)."""
        rows = [i for i, seq in enumerate(seqs) if seq.sampling_params.logprobs is not None]
        if not rows and prompt is None:
            return None
        self = cls()
        if rows:
            assert t is not None
            self.out_rows, self.out_seqs = rows, [seqs[i] for i in rows]
            self.out = self._output(logits, ids, t)
        if prompt is not None:
            self.prompt_rows, self.prompt = prompt.rows, prompt.packed
        return self

    def _output(self, logits: torch.Tensor, ids: torch.Tensor, t: SamplingTensors) -> torch.Tensor:
        params = [seq.sampling_params for seq in self.out_seqs]
        processed = [p.logprobs_mode == "processed" for p in params]
        if any(processed):  # the distribution the sampler drew from, for the whole batch
            logits = processed_logits(logits, t)
        if len(self.out_rows) < len(ids):
            index = to_device(self.out_rows, logits.device)
            logits, ids = logits[index], ids[index]
        logprobs = logits.float().log_softmax(dim=-1)
        return pack(logprobs, ids, max(p.logprobs or 0 for p in params))

    def start_copy(self) -> None:
        """Queue the device->host copies (pinned, no sync): the caller's wait for the sampled ids
        covers them."""
        for name in ("out", "prompt"):
            tensor = getattr(self, name)
            if tensor is not None and tensor.device.type == "cuda":
                host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
                setattr(self, name, host.copy_(tensor, non_blocking=True))

    def finish(self, token_ids: list[int]) -> None:
        """After the step's ids reached the host (token_ids: one per sampled row): the entries
        go onto the sequences."""
        if self.out is not None:
            ks = [seq.sampling_params.logprobs or 0 for seq in self.out_seqs]
            chosen = [token_ids[i] for i in self.out_rows]
            for seq, entry in zip(self.out_seqs, unpack(self.out.cpu().numpy(), chosen, ks)):
                seq.new_logprobs.append(entry)
        if self.prompt is not None:
            p = self.prompt_rows
            assert p is not None
            ks = [seq.sampling_params.prompt_logprobs or 0 for seq, n in zip(p.seqs, p.counts)]
            entries = unpack(
                self.prompt.cpu().numpy(),
                p.targets.tolist(),
                [k for k, n in zip(ks, p.counts) for _ in range(n)],
            )
            at = 0
            for seq, n in zip(p.seqs, p.counts):
                seq.new_prompt_logprobs += entries[at : at + n]
                seq.num_prompt_logprobs += n
                at += n
