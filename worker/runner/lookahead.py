"""Decode lookahead: ModelRunner launches decode step N+1 before step N's sampled ids reach the host.

After sampling step N (ids still on the device) the runner forwards step N+1 with those ids copied
device-to-device, for the sequences that do not surely stop by length and whose next KV slot is
allocated (LLMEngine reserves it); only then does it wait for N's ids. The host's postprocess, schedule and prepare of N+1
overlap that forward, so the GPU does not idle between steps. run(N+1) takes the foreseen logits
for the sequences it schedules (a subset, in order, when some stopped or were aborted or preempted),
else forwards afresh. A foreseen forward writes only the KV its sequences would write anyway, into a
slot of their own last block; a block freed meanwhile is rewritten by its next owner before it is read.
"""

from dataclasses import dataclass

import numpy as np
import torch

from nanoserve.worker.runner.host_copy import to_device
from nanoserve.worker.runner.step_inputs import StepInputs
from nanoserve.worker.sequence import Sequence


@dataclass(slots=True)
class Foreseen:
    """A decode step forwarded ahead of the scheduler: its inputs (input_ids are the device ids
    of the step before, unknown on the host) and its (B, vocab) logits.

    The logits may be a view of a CUDA graph's output buffer, valid until the next replay: they
    must be consumed before any other forward. `forward_index` is the runner's forward count right
    after this one; the runner refuses the logits when another forward came in between."""

    seq_ids: list[int]
    x: StepInputs
    logits: torch.Tensor
    forward_index: int


def next_decode_inputs(
    x: StepInputs, seqs: list[Sequence], block_size: int, max_model_len: int
) -> tuple[np.ndarray, StepInputs] | None:
    """The decode step after decode step x for the sequences that may go on: (their rows in x, the
    step). Sequences that surely stop by length (max_tokens, max_model_len) are left out; None when
    none is left or one's next slot has no block (LLMEngine reserves it: BlockManager.reserve_next)."""
    keep = [i for i, seq in enumerate(seqs) if not seq.reaches_length(1, max_model_len)]
    if not keep:
        return None
    rows = np.asarray(keep, dtype=np.int64)
    positions = x.context_lens[rows]  # (K,) the token sampled by x sits at position len
    tables = x.block_tables[rows]
    block_index = positions // block_size
    if (block_index >= tables.shape[1]).any():
        return None
    blocks = tables[np.arange(len(rows)), block_index]
    if (blocks < 0).any():
        return None
    lens = positions + 1
    k = len(rows)
    return rows, StepInputs(
        False,
        np.zeros(k, dtype=np.int64),
        positions,
        blocks * block_size + positions % block_size,
        np.arange(k + 1),
        lens,
        tables,
        np.arange(k),
        1,
        int(lens.max()),
    )


def foreseen_rows(
    f: Foreseen, seqs: list[Sequence], x: StepInputs, block_size: int
) -> np.ndarray | None:
    """Rows of f's logits for the decode step x over seqs, or None when x is not (a subset in
    order of) the foreseen step: another sequence, position, slot, or block under its context (a
    block reserved since, past the context, changes nothing the step reads)."""
    if x.is_prefill or len(seqs) > len(f.seq_ids):
        return None
    where = {seq_id: i for i, seq_id in enumerate(f.seq_ids)}
    rows = np.fromiter((where.get(seq.seq_id, -1) for seq in seqs), dtype=np.int64, count=len(seqs))
    if (rows < 0).any() or (np.diff(rows) <= 0).any():
        return None
    fx = f.x
    if not (
        np.array_equal(fx.positions[rows], x.positions)
        and np.array_equal(fx.slot_mapping[rows], x.slot_mapping)
        and np.array_equal(fx.context_lens[rows], x.context_lens)
    ):
        return None
    w = min(x.block_tables.shape[1], fx.block_tables.shape[1])
    read = np.arange(w)[None, :] < -(-x.context_lens[:, None] // block_size)  # (B, w) blocks read
    if (-(-x.context_lens // block_size) > w).any():
        return None
    same = x.block_tables[:, :w] == fx.block_tables[rows, :w]
    return rows if (same | ~read).all() else None


def foreseen_logits(
    f: Foreseen | None, num_forwards: int, seqs: list[Sequence], x: StepInputs, block_size: int
) -> torch.Tensor | None:
    """The logits of step x from the step forwarded ahead (`f`), when it foresaw x; `num_forwards`
    is the runner's forward count now: none may have run since f (the graph's output buffer that
    f.logits views would have been overwritten)."""
    if f is None:
        return None
    if f.forward_index != num_forwards:
        between = num_forwards - f.forward_index
        raise RuntimeError(
            f"decode lookahead: {between} forward(s) ran between the step "
            "forwarded ahead and its use"
        )
    rows = foreseen_rows(f, seqs, x, block_size)
    if rows is None:
        return None
    if len(rows) == len(f.seq_ids):
        return f.logits
    return f.logits[to_device(rows, f.logits.device)]
