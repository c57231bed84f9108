"""Per-step sampling inputs: SamplingTensors built from the scheduled Sequences' parameters and
history (one copy per field), and the generators of seeded requests. ModelRunner.run hands them,
with the logits, to worker.sampler.sample.
"""
import numpy as np
import torch

from nanoserve.worker.engine.sequence import Sequence
from nanoserve.worker.sampler import SamplingTensors


class SamplingInputs:

    def __init__(self, device: torch.device, vocab_size: int, eos_token_ids: tuple[int, ...] = ()):
        self.device, self.vocab_size = device, vocab_size
        self.eos_token_ids = tuple(t for t in eos_token_ids if t < vocab_size)  # others never sampled
        self.request_generators: dict[int, torch.Generator] = {}  # seq_id -> generator

    def prepare(self, seqs: list[Sequence]) -> SamplingTensors:
        params = [seq.sampling_params for seq in seqs]
        t = SamplingTensors(temperatures=None, top_ks=None, top_ps=None, min_ps=None,
                            all_greedy=all(p.greedy for p in params))
        if any(p.has_penalties for p in params):
            self._penalty_tensors(seqs, t)
        if any(p.min_tokens for p in params):
            self._banned_tokens(seqs, t)
        if t.all_greedy:  # argmax only: no per-row tensors to copy
            return t
        vocab = self.vocab_size
        # one host->device copy: (4, B) rows of temperature, top-k, top-p, min-p
        rows = torch.tensor([[0.0 if p.greedy else p.temperature for p in params],
                             [p.top_k if p.top_k > 0 else vocab for p in params],
                             [p.top_p for p in params], [p.min_p for p in params]],
                            dtype=torch.float32).to(self.device)
        t.temperatures = rows[0]
        if any(p.top_k > 0 for p in params):
            t.top_ks = rows[1].long()
        if any(p.top_p < 1 for p in params):
            t.top_ps = rows[2]
        if any(p.min_p > 0 for p in params):
            t.min_ps = rows[3]
        t.generators = {i: self._generator(seq) for i, seq in enumerate(seqs)
                        if seq.sampling_params.seed is not None}
        return t

    def _penalty_tensors(self, seqs: list[Sequence], t: SamplingTensors) -> None:
        """Penalty factors, and which tokens each sequence has seen: built with a few copies for
        the whole batch, not per sequence."""
        dev, vocab, b = self.device, self.vocab_size, len(seqs)
        params = [seq.sampling_params for seq in seqs]
        factors = torch.tensor([[p.repetition_penalty for p in params],
                                [p.presence_penalty for p in params],
                                [p.frequency_penalty for p in params]]).to(dev)
        t.repetition_penalties, t.presence_penalties, t.frequency_penalties = factors
        prompt_lens = [seq.num_prompt_tokens for seq in seqs]
        out_lens = [len(seq.token_ids) - n for seq, n in zip(seqs, prompt_lens)]
        ids = np.fromiter((tok for seq in seqs for tok in seq.token_ids), dtype=np.int64)
        row_of = np.repeat(np.arange(b), [len(seq.token_ids) for seq in seqs])
        is_prompt = np.concatenate([np.arange(n + m) < n for n, m in zip(prompt_lens, out_lens)])
        ids_d, rows_d = torch.from_numpy(ids).to(dev), torch.from_numpy(row_of).to(dev)
        prompt_d = torch.from_numpy(is_prompt).to(dev)
        t.prompt_mask = torch.zeros(b, vocab, dtype=torch.bool, device=dev)
        t.prompt_mask[rows_d[prompt_d], ids_d[prompt_d]] = True
        t.output_counts = torch.zeros(b, vocab, dtype=torch.float32, device=dev)
        out = ~prompt_d
        t.output_counts.index_put_((rows_d[out], ids_d[out]),
                                   torch.ones(sum(out_lens), device=dev), accumulate=True)

    def _banned_tokens(self, seqs: list[Sequence], t: SamplingTensors) -> None:
        """Rows that have not yet produced min_tokens may not sample eos (unless ignore_eos) or a
        stop id: the token sampled now is completion token number num_completion_tokens + 1."""
        rows, ids = [], []
        for i, seq in enumerate(seqs):
            sp = seq.sampling_params
            if seq.num_completion_tokens >= sp.min_tokens:
                continue
            banned = set(sp.stop_token_ids)
            if not sp.ignore_eos:
                banned.update(self.eos_token_ids)
            rows += [i] * len(banned)
            ids += banned
        if rows:
            t.banned = (torch.tensor(rows).to(self.device), torch.tensor(ids).to(self.device))

    def _generator(self, seq: Sequence) -> torch.Generator:
        gen = self.request_generators.get(seq.seq_id)
        if gen is None:
            gen = torch.Generator(self.device).manual_seed(seq.sampling_params.seed)
            self.request_generators[seq.seq_id] = gen
        return gen

    def release(self, seq: Sequence) -> None:
        """Forget per-request state of a finished or aborted sequence."""
        self.request_generators.pop(seq.seq_id, None)
