"""Prefill token-count buckets (worker.runner.prefill_graph): which sizes exist, how a step is padded
to one, and which prefill-attention tile sizes the start-up warm-up compiles."""

import numpy as np
import pytest

from nanoserve.worker.kernels.prefill_attention import prefill_block_q, prefill_block_q_lengths
from nanoserve.worker.runner.prefill_graph import (
    attention_warmup_steps,
    bucket_for,
    pad_to_bucket,
    prefill_buckets,
)
from nanoserve.worker.runner.step_inputs import StepInputs


def test_buckets_are_increasing_multiples_of_16_ending_at_the_limit():
    for top in (1, 15, 16, 17, 600, 4096, 8192, 16384, 10000):
        b = prefill_buckets(top)
        assert b[-1] == top and b == sorted(set(b))
        assert all(n % 16 == 0 for n in b[:-1])
    assert prefill_buckets(0) == []
    assert prefill_buckets(8192)[:8] == [16, 32, 64, 128, 256, 384, 512, 768]


@pytest.mark.parametrize("n", [1, 2, 15, 16, 17, 37, 255, 257, 600, 601, 777, 1500, 4000, 8191])
def test_padding_stays_under_a_third_past_256_tokens(n):
    b = bucket_for(n, prefill_buckets(8192))
    assert b is not None and b >= n
    assert b == 16 if n <= 16 else b < 2 * n
    if n > 256:
        assert (b - n) / b < 1 / 3


def test_past_the_largest_bucket_is_none():
    assert bucket_for(8193, prefill_buckets(8192)) is None
    assert bucket_for(5, []) is None


def step(n: int) -> StepInputs:
    # two sequences of a prefill step: 3 cached + (n - 2) new, and 2 new
    ids = np.arange(1, n + 1)
    pos = np.concatenate([np.arange(3, 3 + n - 2), np.arange(2)])
    slots = np.arange(100, 100 + n)
    return StepInputs(
        True,
        ids,
        pos,
        slots,
        np.array([0, n - 2, n]),
        np.array([n + 1, 2]),
        np.array([[0, 1], [2, -1]]),
        np.array([n - 3, n - 1]),
        n - 2,
        n + 1,
    )


def test_pad_to_bucket_pads_outside_every_sequence():
    x = pad_to_bucket(step(37), prefill_buckets(8192))
    assert len(x.input_ids) == len(x.positions) == len(x.slot_mapping) == 64
    assert (x.slot_mapping[37:] == -1).all() and (x.input_ids[37:] == 0).all()
    assert (x.positions[37:] == 0).all()
    assert (x.input_ids[:37] == np.arange(1, 38)).all() and (x.slot_mapping[:37] >= 100).all()
    # what the attention and the sampler read is untouched
    assert x.cu_seqlens_q.tolist() == [0, 35, 37] and x.logit_rows.tolist() == [34, 36]
    # the encoding round-trips with the padded sizes
    y = StepInputs.decode(x.encode())
    assert (y.slot_mapping == x.slot_mapping).all() and y.dims == x.dims


def test_pad_to_bucket_leaves_exact_and_oversized_steps():
    for n, buckets in ((64, prefill_buckets(8192)), (40, prefill_buckets(32)), (40, [])):
        x = pad_to_bucket(step(n), buckets)
        assert len(x.input_ids) == n


@pytest.mark.parametrize("group, fp32", [(1, False), (2, False), (4, True), (8, False), (16, True)])
def test_warmup_lengths_reach_every_tile_size(group, fp32):
    """Every BLOCK_Q some prompt length selects is compiled at start (one length each)."""
    reachable = {prefill_block_q(n, group, fp32) for n in range(1, 5000)}
    lengths = prefill_block_q_lengths(group, fp32)
    assert {prefill_block_q(n, group, fp32) for n in lengths} == reachable
    assert len(lengths) == len(reachable)
    steps = attention_warmup_steps(group, fp32, block_size=16)
    assert [s.max_seqlen_q for s in steps] == lengths
    for s in steps:
        n = s.max_seqlen_q
        assert (s.slot_mapping == -1).all() and s.block_tables.shape == (1, -(-n // 16))
        assert s.cu_seqlens_q.tolist() == [0, n] and s.context_lens.tolist() == [n]
