"""Per-step tensors of logit_bias and allowed_token_ids for worker.runner.sampler.apply_token_rules. Each
sequence's ids and biases go to the device once, at its first step; a step then concatenates those of
its rows on the device into (row, token) index tensors, after one small host->device copy of the
rows and their counts. SamplingInputs.prepare calls it only for a batch where some row has one.
"""

from dataclasses import dataclass

import numpy as np
import torch

from nanoserve.worker.runner.host_copy import to_device
from nanoserve.worker.runner.sampler import SamplingTensors
from nanoserve.worker.sequence import Sequence


@dataclass(slots=True)
class RowRules:
    """One sequence's rules on the device."""

    bias: tuple[torch.Tensor, torch.Tensor] | None  # ids (N,) int64, biases (N,) float32
    allowed: torch.Tensor | None  # (M,) int64 ids; None: every token allowed


class TokenRules:
    def __init__(self, device: torch.device):
        self.device = device
        self.rules: dict[int, RowRules] = {}  # seq_id -> its rules, until release()

    def fill(self, seqs: list[Sequence], t: SamplingTensors) -> None:
        """Sets t.logit_bias and t.allowed_token_ids for the rows (seqs, in batch order) that ask."""
        bias_rows: list[int] = []
        bias_ids: list[torch.Tensor] = []
        biases: list[torch.Tensor] = []
        restricted: list[int] = []
        allowed: list[torch.Tensor] = []
        for row, seq in enumerate(seqs):
            if not seq.sampling_params.has_token_rules:
                continue
            rules = self._rules(seq)
            if rules.bias is not None:
                bias_rows.append(row)
                bias_ids.append(rules.bias[0])
                biases.append(rules.bias[1])
            if rules.allowed is not None:
                restricted.append(row)
                allowed.append(rules.allowed)
        bias_counts = [len(ids) for ids in bias_ids]
        allowed_counts = [len(ids) for ids in allowed]
        # one copy: [bias rows | their counts | restricted rows | their counts]
        host = bias_rows + bias_counts + restricted + allowed_counts
        index = to_device(host, self.device, torch.int64)
        b, g = len(bias_rows), len(restricted)
        if b:
            rows = index[:b].repeat_interleave(index[b : 2 * b], output_size=sum(bias_counts))
            t.logit_bias = (rows, torch.cat(bias_ids), torch.cat(biases))
        if g:
            restricted_rows = index[2 * b : 2 * b + g]
            rows = restricted_rows.repeat_interleave(
                index[2 * b + g :], output_size=sum(allowed_counts)
            )
            t.allowed_token_ids = (restricted_rows, rows, torch.cat(allowed))

    def _rules(self, seq: Sequence) -> RowRules:
        """The sequence's rules on the device, copied at its first step."""
        rules = self.rules.get(seq.seq_id)
        if rules is None:
            sp = seq.sampling_params
            bias, allowed = sp.logit_bias, sp.allowed_token_ids
            rules = self.rules[seq.seq_id] = RowRules(
                None
                if bias is None
                else (
                    self._copy(np.fromiter(bias.keys(), np.int64, len(bias))),
                    self._copy(np.fromiter(bias.values(), np.float32, len(bias))),
                ),
                None if allowed is None else self._copy(np.asarray(allowed, dtype=np.int64)),
            )
        return rules

    def _copy(self, values: np.ndarray) -> torch.Tensor:
        return to_device(values, self.device)

    def release(self, seq: Sequence) -> None:
        """Forget a finished or aborted sequence's rules."""
        self.rules.pop(seq.seq_id, None)
