"""Builds one step's StepInputs from the scheduled Sequences (ModelRunner.run, then the forward).

A prefill step computes logits for the last token of each sequence that samples, and, for a
sequence that asked for prompt logprobs, for every prompt position of its chunk not done yet:
those come last among the logit rows (StepInputs.num_prompt_rows; PromptRows says whose they are).
"""

import numpy as np

from nanoserve.worker.runner.logprobs import PROMPT_CHUNK_ROWS, PromptRows
from nanoserve.worker.runner.prefill_graph import pad_to_bucket
from nanoserve.worker.runner.step_inputs import StepInputs
from nanoserve.worker.sequence import Sequence


def block_tables(seqs: list[Sequence]) -> np.ndarray:
    """(B, W) the sequences' block tables, -1 padded."""
    width = max(len(seq.block_table) for seq in seqs)
    table = np.full((len(seqs), width), -1, dtype=np.int64)
    for i, seq in enumerate(seqs):
        table[i, : len(seq.block_table)] = seq.block_table
    return table


def prepare_prefill(
    seqs: list[Sequence],
    block_size: int,
    buckets: list[int],
    prompt_chunk_rows: int = PROMPT_CHUNK_ROWS,
) -> tuple[StepInputs, PromptRows | None]:
    """A step with prompt tokens; a mixed step's decodes come first, as 1-token extends.
    prompt_chunk_rows: the prompt-logprob rows one LM-head call takes (ModelRunner.execute)."""
    n = len(seqs)
    # vectorized over the step's tokens: a mixed step has a row a decode (~250), and a loop of
    # numpy calls a sequence took ~2.5 ms of host time a step (the GPU idles through it)
    starts = np.fromiter((seq.num_computed_tokens for seq in seqs), dtype=np.int64, count=n)
    q_lens = np.fromiter((seq.num_scheduled_tokens for seq in seqs), dtype=np.int64, count=n)
    input_ids: list[int] = []
    for seq, start, end in zip(seqs, starts.tolist(), (starts + q_lens).tolist()):
        input_ids += seq.token_ids[start:end]
    # logits only for sequences whose prompt is complete after this step (not for a mid chunk)
    sampled = [seq.samples_this_step for seq in seqs]
    x = extend_step(input_ids, starts, q_lens, block_tables(seqs), sampled, block_size)
    x.prompt_chunk_rows = prompt_chunk_rows
    prompt = None
    if any(seq.needs_prompt_logprobs for seq in seqs):
        prompt_rows, prompt = _prompt_rows(seqs, x.cu_seqlens_q)
        x.logit_rows = np.concatenate([x.logit_rows, np.asarray(prompt_rows, dtype=np.int64)])
        x.num_prompt_rows = len(prompt_rows)
    return pad_to_bucket(x, buckets), prompt


def extend_step(
    input_ids: list[int],
    starts: np.ndarray,
    q_lens: np.ndarray,
    tables: np.ndarray,
    sampled: list[bool],
    block_size: int,
) -> StepInputs:
    """A prefill-form step (not padded): sequence i extends its first starts[i] computed tokens by
    q_lens[i] tokens (its ids in input_ids, sequence after sequence); a logit row for the last
    token of each sampled one."""
    bs = block_size
    k_lens = starts + q_lens
    cu_q = np.concatenate([[0], np.cumsum(q_lens)])
    row = np.repeat(np.arange(len(starts)), q_lens)  # (T,) each token's sequence
    positions = np.arange(cu_q[-1]) - cu_q[:-1][row] + starts[row]
    slots = tables[row, positions // bs] * bs + positions % bs
    rows = [cu_q[i + 1] - 1 for i, s in enumerate(sampled) if s]
    return StepInputs(
        True,
        np.asarray(input_ids, dtype=np.int64),
        positions,
        slots,
        cu_q,
        k_lens,
        tables,
        np.asarray(rows, dtype=np.int64),
        int(q_lens.max()),
        int(k_lens.max()),
    )


def _prompt_rows(seqs: list[Sequence], cu_q: np.ndarray) -> tuple[list[int], PromptRows | None]:
    """The step's prompt-position rows, sequence after sequence: position p's logits give the
    logprob of prompt token p + 1, for the tokens after those already done. Their number is at
    most the step's tokens (max_num_batched_tokens): that bounds a step's prompt rows."""
    rows: list[int] = []
    targets: list[int] = []
    asking: list[Sequence] = []
    counts: list[int] = []
    for i, seq in enumerate(seqs):
        if not seq.needs_prompt_logprobs:
            continue
        start = seq.num_computed_tokens
        end = start + seq.num_scheduled_tokens
        lo, hi = max(start, seq.num_prompt_logprobs), min(end, seq.num_prompt_tokens - 1)
        if lo < hi:
            rows += range(cu_q[i] + lo - start, cu_q[i] + hi - start)
            targets += seq.token_ids[lo + 1 : hi + 1]
            asking.append(seq)
            counts.append(hi - lo)
    if not asking:  # a chunk whose positions are all done (a recompute after preemption)
        return rows, None
    return rows, PromptRows(asking, counts, np.asarray(targets, dtype=np.int64))


def prepare_decode(seqs: list[Sequence], block_size: int) -> StepInputs:
    bs, n = block_size, len(seqs)
    lens = np.fromiter((len(seq.token_ids) for seq in seqs), dtype=np.int64, count=n)
    last_blocks = np.fromiter(
        (seq.block_table[(k - 1) // bs] for seq, k in zip(seqs, lens)), dtype=np.int64, count=n
    )
    return StepInputs(
        False,
        np.fromiter((seq.token_ids[-1] for seq in seqs), np.int64, n),
        lens - 1,
        last_blocks * bs + (lens - 1) % bs,
        np.arange(n + 1),
        lens,
        block_tables(seqs),
        np.arange(n),
        1,
        int(lens.max()),
    )
