"""kernels.paged_prefill_attention against the torch reference (worker.layers.attention), run on CPU
by the Triton interpreter: full prompts, extends after a cached prefix (row by row over 16-token
pages), half precision, empty sequences and a strided q."""

import pytest
import torch

from nanoserve.worker.layers.attention import paged_attention_torch
from tests.unit.interpreted_kernels import (
    TOL,
    kernels,
    make_block_tables,
    make_cache,
    poison_unused,
    rel_err,
)


def run_prefill_case(
    q_lens: list[int],
    context_lens: list[int],
    block_size: int,
    group: int,
    dtype,
    seed: int,
    hkv: int = 2,
    d: int = 32,
) -> None:
    out, ref = prefill_and_reference(q_lens, context_lens, block_size, group, dtype, seed, hkv, d)
    assert out.dtype == dtype and out.shape == ref.shape
    assert rel_err(out, ref) < TOL[dtype]


def prefill_and_reference(
    q_lens: list[int],
    context_lens: list[int],
    block_size: int,
    group: int,
    dtype,
    seed: int,
    hkv: int,
    d: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's output over a random paged cache (unread slots NaN) and the fp32 reference."""
    gen = torch.Generator().manual_seed(seed)
    num_blocks = sum((n + block_size - 1) // block_size for n in context_lens) + 3
    k_cache, v_cache = make_cache(num_blocks, block_size, hkv, d, dtype, gen)
    tables = make_block_tables(context_lens, block_size, num_blocks, gen, pad=0)
    poison_unused(k_cache, v_cache, tables, context_lens)
    cu = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32)
    lens = torch.tensor(context_lens, dtype=torch.int32)
    q = torch.randn(sum(q_lens), group * hkv, d, generator=gen).to(dtype)
    out = kernels.paged_prefill_attention(q, k_cache, v_cache, tables, cu, lens, d**-0.5)
    ref = paged_attention_torch(
        q.float(), k_cache.float(), v_cache.float(), tables, cu, lens, d**-0.5
    )
    return out, ref


@pytest.mark.parametrize("group", [1, 2, 4])
@pytest.mark.parametrize("block_size", [16, 32])
def test_prefill_full_prompts(group, block_size):
    lens = [1, 15, 16, 17, 33, 70]
    run_prefill_case(lens, lens, block_size, group, torch.float32, seed=group + block_size)


@pytest.mark.parametrize("group", [1, 2, 4])
def test_prefill_extend_after_cached_prefix(group):
    # prefix-cache hits and chunked prefill: qlen < context_len, chunks crossing block boundaries
    q_lens = [1, 5, 16, 9, 40, 3]
    context_lens = [17, 21, 48, 9, 75, 32]
    run_prefill_case(q_lens, context_lens, 16, group, torch.float32, seed=10 + group)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_prefill_half_precision(dtype):
    run_prefill_case([7, 40, 20], [7, 70, 20], 32, 2, dtype, seed=5, d=64)


def test_prefill_skips_empty_sequences_and_strided_q():
    gen = torch.Generator().manual_seed(4)
    hkv, d, group, block_size = 2, 16, 2, 16
    context_lens = [10, 0, 37]
    k_cache, v_cache = make_cache(8, block_size, hkv, d, torch.float32, gen)
    tables = make_block_tables(context_lens, block_size, 8, gen)
    cu = torch.tensor([0, 10, 10, 15], dtype=torch.int32)
    lens = torch.tensor(context_lens, dtype=torch.int32)
    # q as a strided view of a fused qkv buffer: (tokens, (Hq + 2 Hkv) * D)
    qkv = torch.randn(15, (group * hkv + 2 * hkv) * d, generator=gen)
    q = qkv[:, : group * hkv * d].view(15, group * hkv, d)
    out = kernels.paged_prefill_attention(q, k_cache, v_cache, tables, cu, lens, 0.3)
    ref = paged_attention_torch(q, k_cache, v_cache, tables, cu, lens, 0.3)
    assert rel_err(out, ref) < TOL[torch.float32]


def test_prefill_finds_its_block_among_more_sequences_than_one_scan():
    """70 sequences (past SCAN = 64, the chunk a program reads cu_seqlens_q in), empty ones among
    them: each program finds its (sequence, query block) from cu_seqlens_q alone."""
    assert kernels.prefill_attention.SCAN < 70
    gen = torch.Generator().manual_seed(7)
    q_lens = [
        0 if i % 9 == 4 else 1 + int(x)
        for i, x in enumerate(torch.randint(0, 6, (70,), generator=gen))
    ]
    prefix = torch.randint(0, 20, (70,), generator=gen).tolist()
    context_lens = [q + p for q, p in zip(q_lens, prefix)]
    run_prefill_case(q_lens, context_lens, 16, 2, torch.float32, seed=7, hkv=1, d=16)


def test_prefill_over_a_padded_batch_equals_the_step():
    """What a prefill graph replays: the step's metadata copied into buffers of a fixed batch
    (cu_seqlens_q padded with its last entry, so the extra sequences own no block) gives the
    step's output bit for bit."""
    gen = torch.Generator().manual_seed(8)
    hkv, d, group, block_size = 2, 16, 2, 16
    context_lens = [10, 40, 21]  # 10, 3 and 21 new tokens (the second after a 37-token prefix)
    k_cache, v_cache = make_cache(12, block_size, hkv, d, torch.float32, gen)
    tables = make_block_tables(context_lens, block_size, 12, gen)
    cu = torch.tensor([0, 10, 13, 34], dtype=torch.int32)
    lens = torch.tensor(context_lens, dtype=torch.int32)
    q = torch.randn(40, group * hkv, d, generator=gen)  # 34 tokens padded to a bucket of 40
    out = kernels.paged_prefill_attention(q, k_cache, v_cache, tables, cu, lens, 0.3)
    batch = 8  # the graph's buffers: stale rows past the step's 3 sequences
    static_cu = torch.cat([cu, cu[-1:].expand(batch - 3)])
    static_lens = torch.cat([lens, torch.full((batch - 3,), 99, dtype=torch.int32)])
    static_tables = torch.full((batch, tables.shape[1] + 2), 5, dtype=torch.int32)
    static_tables[:3, : tables.shape[1]] = tables
    padded = kernels.paged_prefill_attention(
        q, k_cache, v_cache, static_tables, static_cu, static_lens, 0.3
    )
    assert torch.equal(padded[:34], out[:34])
    ref = paged_attention_torch(q[:34], k_cache, v_cache, tables, cu, lens, 0.3)
    assert rel_err(out[:34], ref) < TOL[torch.float32]


def extend_cases(seed: int, num_calls: int, per_call: int) -> list[tuple[list[int], list[int]]]:
    """Calls of several sequences each: (q_lens, context_lens) with a cached prefix of any length
    (0..~300, multiples of the 16-token page and of the 64-key tile among them) and 1..100 new
    tokens, so tiles start and end mid-page and mid-prefix."""
    gen = torch.Generator().manual_seed(seed)
    edges = [0, 1, 15, 16, 17, 48, 63, 64, 65, 127, 128, 129, 255, 256, 257]
    calls = []
    for _ in range(num_calls):
        q_lens, context_lens = [], []
        for _ in range(per_call):
            r = torch.randint(0, 1 << 20, (3,), generator=gen).tolist()
            prefix = edges[r[0] % len(edges)] if r[2] % 2 else r[0] % 300
            q_len = 1 + r[1] % 100
            q_lens.append(q_len)
            context_lens.append(prefix + q_len)
        calls.append((q_lens, context_lens))
    return calls


@pytest.mark.parametrize(
    "group, dtype",
    [(1, torch.float32), (2, torch.float32), (4, torch.float32), (2, torch.bfloat16)],
)
def test_prefill_extend_over_16_token_pages_row_by_row(group, dtype):
    """Prefix-cache hits over 16-token pages (issue 12's block16 case): every query row of every
    sequence matches the reference, so one wrong page in one tile cannot hide in a global norm.
    bf16 takes the GPU's tile shape (BLOCK_Q = 128 // group); unread slots are NaN."""
    hkv, d, block_size = 2, 32, 16
    atol = 1e-4 if dtype == torch.float32 else 0.06
    for call, (q_lens, context_lens) in enumerate(extend_cases(group, 4, 6)):
        out, ref = prefill_and_reference(
            q_lens, context_lens, block_size, group, dtype, 100 * group + call, hkv, d
        )
        err = (out.float() - ref).abs().amax(dim=(1, 2))  # (tokens,)
        bad = (err > atol).nonzero().flatten().tolist()
        assert not bad, (q_lens, context_lens, bad[:8], err.max().item())
