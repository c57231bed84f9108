"""Decode lookahead: ModelRunner launches decode step N+1 before step N's sampled ids reach the host.

After sampling step N (ids still on the device) the runner forwards step N+1 with those ids copied
device-to-device, when every sequence will surely still run and its next KV slot is already
allocated; only then does it wait for N's ids. The host's postprocess, schedule and prepare of N+1
overlap that forward, so the GPU does not idle between steps. run(N+1) takes the foreseen logits
for the sequences it schedules (a subset, in order, when some stopped or were aborted or preempted),
else forwards afresh. A foreseen forward writes only the KV its sequences would write anyway, into a
slot of their own last block; a block freed meanwhile is rewritten by its next owner before it is read.
"""
from dataclasses import dataclass

import numpy as np
import torch

from worker.engine.sequence import Sequence
from worker.engine.step_inputs import StepInputs


@dataclass(slots=True)
class Foreseen:
    """A decode step forwarded ahead of the scheduler: its inputs (input_ids are the device ids
    of the step before, unknown on the host) and its (B, vocab) logits."""
    seq_ids: list[int]
    x: StepInputs
    logits: torch.Tensor


def next_decode_inputs(x: StepInputs, seqs: list[Sequence], block_size: int,
                       max_model_len: int) -> StepInputs | None:
    """The decode step after decode step x if every sequence goes on; None when one surely stops
    by length (max_tokens or max_model_len) or its next token's slot needs a new block."""
    for seq in seqs:
        max_tokens = seq.sampling_params.max_tokens
        if max_tokens is not None and seq.num_completion_tokens + 1 >= max_tokens:
            return None
        if seq.num_tokens + 1 >= max_model_len:
            return None
    n = len(seqs)
    positions = x.context_lens.copy()  # (B,) the token sampled by x sits at position len
    block_index = positions // block_size
    if (block_index >= x.block_tables.shape[1]).any():
        return None
    blocks = x.block_tables[np.arange(n), block_index]
    if (blocks < 0).any():
        return None
    lens = positions + 1
    return StepInputs(False, np.zeros(n, dtype=np.int64), positions,
                      blocks * block_size + positions % block_size, x.cu_seqlens_q, lens,
                      x.block_tables, x.logit_rows, 1, int(lens.max()))


def foreseen_rows(f: Foreseen, seqs: list[Sequence], x: StepInputs) -> np.ndarray | None:
    """Rows of f's logits for the decode step x over seqs, or None when x is not (a subset in
    order of) the foreseen step: another sequence, position, slot or block table."""
    if x.is_prefill or len(seqs) > len(f.seq_ids):
        return None
    where = {seq_id: i for i, seq_id in enumerate(f.seq_ids)}
    rows = np.fromiter((where.get(seq.seq_id, -1) for seq in seqs), dtype=np.int64,
                       count=len(seqs))
    if (rows < 0).any() or (np.diff(rows) <= 0).any():
        return None
    fx, w = f.x, x.block_tables.shape[1]
    if not (np.array_equal(fx.positions[rows], x.positions)
            and np.array_equal(fx.slot_mapping[rows], x.slot_mapping)
            and np.array_equal(fx.context_lens[rows], x.context_lens)
            and np.array_equal(fx.block_tables[rows, :w], x.block_tables)
            and (fx.block_tables[rows, w:] < 0).all()):
        return None
    return rows
