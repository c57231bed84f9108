"""Per-step tensors of logit_bias and allowed_token_ids for worker.sampler.apply_token_rules: each
sequence's ids and biases become numpy arrays once, and a step concatenates those of its rows into
(row, token) index tensors, two host->device copies in all. SamplingInputs.prepare calls it only
for a batch where some row has one.
"""

import numpy as np
import torch

from nanoserve.worker.engine.sequence import Sequence
from nanoserve.worker.sampler import SamplingTensors


class TokenRules:
    def __init__(self, device: torch.device):
        self.device = device
        # seq_id -> (bias ids (N,) int64, biases (N,) float32, allowed ids (M,) int64 or None)
        self.arrays: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray | None]] = {}

    def fill(self, seqs: list[Sequence], t: SamplingTensors) -> None:
        """Sets t.logit_bias and t.allowed_token_ids for the rows (seqs, in batch order) that ask."""
        bias_rows: list[int] = []  # rows with a bias, and their arrays
        bias_ids: list[np.ndarray] = []
        biases: list[np.ndarray] = []
        restricted: list[int] = []  # rows with allowed_token_ids, and their arrays
        allowed: list[np.ndarray] = []
        for row, seq in enumerate(seqs):
            if not seq.sampling_params.has_token_rules:
                continue
            ids, row_biases, only = self._arrays(seq)
            if len(ids):
                bias_rows.append(row)
                bias_ids.append(ids)
                biases.append(row_biases)
            if only is not None:
                restricted.append(row)
                allowed.append(only)
        # one int64 buffer: [bias rows (N) | bias ids (N) | restricted rows (G) | rows (M) | ids (M)]
        parts: list[np.ndarray] = []
        if bias_rows:
            parts += [np.repeat(bias_rows, [len(a) for a in bias_ids]), *bias_ids]
        if restricted:
            rows = np.repeat(restricted, [len(a) for a in allowed])
            parts += [np.asarray(restricted), rows, *allowed]
        index = torch.from_numpy(np.concatenate(parts, dtype=np.int64)).to(self.device)
        n = sum(len(a) for a in bias_ids)
        if bias_rows:
            bias = torch.from_numpy(np.concatenate(biases)).to(self.device)
            t.logit_bias = (index[:n], index[n : 2 * n], bias)
        if restricted:
            g, m = len(restricted), sum(len(a) for a in allowed)
            rest = index[2 * n :]
            t.allowed_token_ids = (rest[:g], rest[g : g + m], rest[g + m :])

    def _arrays(self, seq: Sequence) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """The sequence's (bias ids, biases, allowed ids), made at its first step."""
        arrays = self.arrays.get(seq.seq_id)
        if arrays is None:
            sp = seq.sampling_params
            bias = sp.logit_bias or {}
            only = sp.allowed_token_ids
            arrays = self.arrays[seq.seq_id] = (
                np.fromiter(bias.keys(), dtype=np.int64, count=len(bias)),
                np.fromiter(bias.values(), dtype=np.float32, count=len(bias)),
                None if only is None else np.asarray(only, dtype=np.int64),
            )
        return arrays

    def release(self, seq: Sequence) -> None:
        """Forget a finished or aborted sequence's arrays."""
        self.arrays.pop(seq.seq_id, None)
