"""Decode lookahead: ModelRunner launches decode step N+1 before step N's sampled ids reach the host.

After sampling step N (ids still on the device) the runner forwards step N+1 with those ids copied
device-to-device, for the sequences that do not surely stop by length and whose next KV slot is
allocated (LLMEngine reserves it); only then does it wait for N's ids. The host's postprocess, schedule and prepare of N+1
overlap that forward, so the GPU does not idle between steps. run(N+1) takes the foreseen logits
for the sequences it schedules (a subset, in order, when some stopped or were aborted or preempted),
else forwards afresh. A foreseen forward writes only the KV its sequences would write anyway, into a
slot of their own last block; a block freed meanwhile is rewritten by its next owner before it is read.

With EngineConfig.lookahead_prompts the step after any step may be forwarded ahead as the scheduler
planned it (Scheduler.plan_next: a NextStep): a mixed step (decodes, then prompt chunks whose blocks
were allocated at planning), or the decodes after a prefill step. The same rule takes its logits:
each sequence of the step taken must have been forwarded with the same tokens, slots and blocks.
"""

from dataclasses import dataclass

import numpy as np
import torch

from nanoserve.worker.runner.host_copy import to_device
from nanoserve.worker.runner.prefill_graph import pad_to_bucket
from nanoserve.worker.runner.prepare import block_tables, extend_step
from nanoserve.worker.runner.step_inputs import StepInputs
from nanoserve.worker.sequence import NextStep, Sequence


@dataclass(slots=True)
class Foreseen:
    """A step forwarded ahead of the scheduler (a decode, or a planned step): its sequences, its
    inputs (the decodes' input_ids are the device ids of the step before, unknown on the host
    then) and its (S, vocab) logits, a row per sampled sequence.

    The logits may be a view of a CUDA graph's output buffer, valid until the next replay: they
    must be consumed before any other forward. `forward_index` is the runner's forward count right
    after this one; the runner refuses the logits when another forward came in between."""

    seq_ids: list[int]
    x: StepInputs
    logits: torch.Tensor
    forward_index: int


def planned_inputs(
    plan: NextStep, sampled: list[Sequence], block_size: int, buckets: list[int]
) -> tuple[np.ndarray, StepInputs] | None:
    """(for each decode of the plan its row among this step's `sampled` sequences, the planned
    step) with the decodes' ids left 0 (the device fills them); None when the step samples no
    row, or a decode's next slot has no block (Scheduler.plan_next reserved them)."""
    where = {seq.seq_id: i for i, seq in enumerate(sampled)}
    src = np.fromiter((where[seq.seq_id] for seq in plan.decodes), np.int64, len(plan.decodes))
    # (K,) the token sampled now sits at position len
    positions = np.fromiter((len(seq.token_ids) for seq in plan.decodes), np.int64, len(src))
    if not plan.prompts:
        x = decode_step(positions, block_tables(plan.decodes), block_size) if len(src) else None
        return None if x is None else (src, x)
    if any(p // block_size >= len(s.block_table) for s, p in zip(plan.decodes, positions.tolist())):
        return None
    ids = [0] * len(src)
    sampled_rows = [True] * len(src)
    for seq, start, count in plan.prompts:
        ids += seq.token_ids[start : start + count]
        sampled_rows.append(start + count == len(seq.token_ids))
    if not any(sampled_rows):
        return None
    starts = np.concatenate([positions, [start for _, start, _ in plan.prompts]])
    q_lens = np.asarray([1] * len(src) + [count for _, _, count in plan.prompts], np.int64)
    x = extend_step(ids, starts, q_lens, block_tables(plan.seqs), sampled_rows, block_size)
    return src, pad_to_bucket(x, buckets)


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
    # (K,) the token sampled by x sits at position len
    nxt = decode_step(x.context_lens[rows], x.block_tables[rows], block_size)
    return None if nxt is None else (rows, nxt)


def decode_step(positions: np.ndarray, tables: np.ndarray, block_size: int) -> StepInputs | None:
    """A decode step of one token at positions[i] (K,) for the sequences of block tables (K, W),
    its ids 0 (the device's); None when a token's block is not in its table."""
    block_index = positions // block_size
    if (block_index >= tables.shape[1]).any():
        return None
    k = len(positions)
    blocks = tables[np.arange(k), block_index]
    if (blocks < 0).any():
        return None
    lens = positions + 1
    return StepInputs(
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
    """Rows of f's logits for step x over seqs, or None when x is not (a subset in order of) the
    foreseen step: another sequence, token, position, slot, or block under its context (a block
    reserved since, past the context, changes nothing the step reads)."""
    if len(seqs) > len(f.seq_ids) or x.num_prompt_rows:
        return None
    where = {seq_id: i for i, seq_id in enumerate(f.seq_ids)}
    rows = np.fromiter((where.get(seq.seq_id, -1) for seq in seqs), dtype=np.int64, count=len(seqs))
    if (rows < 0).any() or (np.diff(rows) <= 0).any():
        return None
    fx = f.x
    if x.is_prefill or fx.is_prefill:
        logit_rows = _same_tokens(fx, rows, x)
        if logit_rows is None:
            return None
    elif not (
        np.array_equal(fx.positions[rows], x.positions)
        and np.array_equal(fx.slot_mapping[rows], x.slot_mapping)
        and np.array_equal(fx.context_lens[rows], x.context_lens)
    ):
        return None
    else:
        logit_rows = rows
    w = min(x.block_tables.shape[1], fx.block_tables.shape[1])
    read = np.arange(w)[None, :] < -(-x.context_lens[:, None] // block_size)  # (B, w) blocks read
    if (-(-x.context_lens // block_size) > w).any():
        return None
    same = x.block_tables[:, :w] == fx.block_tables[rows, :w]
    return logit_rows if (same | ~read).all() else None


def _same_tokens(fx: StepInputs, rows: np.ndarray, x: StepInputs) -> np.ndarray | None:
    """Either step in prefill form: whether sequence i of x is sequence rows[i] of fx with the same
    tokens at the same positions and slots (fx's decode ids filled in once known); the rows of
    fx's logits for x's sampled sequences, else None."""
    q = np.diff(x.cu_seqlens_q)
    fq = np.diff(fx.cu_seqlens_q)
    if not (np.array_equal(fq[rows], q) and np.array_equal(fx.context_lens[rows], x.context_lens)):
        return None
    t = int(x.cu_seqlens_q[-1])  # x's tokens before any bucket padding
    seq_of = np.repeat(np.arange(len(rows)), q)  # (t,)
    at = fx.cu_seqlens_q[rows][seq_of] + np.arange(t) - x.cu_seqlens_q[:-1][seq_of]
    if not (
        np.array_equal(fx.input_ids[at], x.input_ids[:t])
        and np.array_equal(fx.positions[at], x.positions[:t])
        and np.array_equal(fx.slot_mapping[at], x.slot_mapping[:t])
    ):
        return None
    # logit rows are the sampled sequences' last tokens, in order (neither step has prompt rows)
    f_sampled = np.isin(fx.cu_seqlens_q[1:] - 1, fx.logit_rows)
    logit_rows = np.where(f_sampled, np.cumsum(f_sampled) - 1, -1)[rows]
    want = np.isin(x.cu_seqlens_q[1:] - 1, x.logit_rows)
    return None if (logit_rows[want] < 0).any() else logit_rows[want]


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
    if len(rows) == f.logits.shape[0]:  # rows increase: all of them, in order
        return f.logits
    return f.logits[to_device(rows, f.logits.device)]
