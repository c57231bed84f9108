"""Logits of one prompt straight from an engine's runner, for tests that judge a run's tokens by
them: a full prefill (every position, no prefix-cache hit) or the prefix-hit prefill that a rerun of
the prompt takes (its last position)."""

from itertools import count

import numpy as np
import torch

from nanoserve.worker import SamplingParams
from nanoserve.worker.sequence import Sequence

_salts = count()


def _prefill(llm, seq: Sequence, logit_rows: np.ndarray | None) -> torch.Tensor:
    """Forward seq's uncached tokens as one prefill step; its blocks are freed after."""
    llm.block_manager.allocate(seq)
    seq.num_scheduled_tokens = seq.num_tokens - seq.num_computed_tokens
    runner = llm.model_runner
    x = runner.prepare_prefill([seq])
    if logit_rows is not None:
        x.logit_rows = logit_rows
    msg = x.encode()
    if runner.publish is not None:  # tensor parallel: the other ranks run the same step
        runner.publish(msg)
    logits = runner.execute(x, msg).float()
    llm.block_manager.deallocate(seq)
    return logits


def teacher_forced_logits(llm, prompt: list[int]) -> torch.Tensor:
    """(len(prompt), vocab) logits of every position from one prefill of the whole prompt. A cache
    salt of its own keeps the prefix cache out: a hit would leave fewer rows than positions (and a
    padded step's last row would be padding)."""
    seq = Sequence(prompt, SamplingParams(), cache_salt=f"teacher-forced {next(_salts)}")
    logits = _prefill(llm, seq, np.arange(len(prompt)))
    assert seq.num_cached_tokens == 0 and logits.shape[0] == len(prompt)
    return logits


def prefix_hit_logits(llm, prompt: list[int]) -> tuple[int, torch.Tensor]:
    """(prompt tokens found in the prefix cache, (vocab,) logits of the last position) from the
    prefill a rerun of prompt takes: its cached blocks are read, the rest computed."""
    seq = Sequence(prompt, SamplingParams())
    logits = _prefill(llm, seq, None)  # prepare_prefill's row: the last token's
    return seq.num_cached_tokens, logits[-1]
