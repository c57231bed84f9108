"""nanoserve.worker.kernels (Triton) against the torch reference in worker.layers.attention, run on CPU by the
interpreter.

TRITON_INTERPRET is read when @triton.jit decorates, so it is set before worker.kernels is imported (and the
kernel modules are reloaded if something imported them earlier without it).
"""

import importlib
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

import pytest
import torch
from triton.runtime import interpreter


def _numpy2_index_shim() -> None:
    # Triton 3.6's interpreter turns a loaded scalar (a 1-element array) into a loop bound
    # with int(array),
    # which numpy >= 2.4 rejects; take the element instead. Interpreter-only: compiled kernels
    # never see this.
    original = interpreter._patch_lang_tensor
    if getattr(original, "nanoserve_shim", False):
        return

    def patched(tensor, scope) -> None:
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched.nanoserve_shim = True
    interpreter._patch_lang_tensor = patched


def _import_kernels():
    _numpy2_index_shim()
    names = [
        "nanoserve.worker.kernels.dtypes",
        "nanoserve.worker.kernels.store_kvcache",
        "nanoserve.worker.kernels.prefill_attention",
        "nanoserve.worker.kernels.decode_attention",
        "nanoserve.worker.kernels.norm",
        "nanoserve.worker.kernels",
    ]
    if "nanoserve.worker.kernels.decode_attention" in sys.modules:
        decode = sys.modules["nanoserve.worker.kernels.decode_attention"]
        if not isinstance(decode._decode_split_kernel, interpreter.InterpretedFunction):
            for name in names:
                if name in sys.modules:
                    importlib.reload(sys.modules[name])
    return importlib.import_module("nanoserve.worker.kernels")


kernels = _import_kernels()


def decode_module():
    return sys.modules["nanoserve.worker.kernels.decode_attention"]


from nanoserve.worker.layers.attention import paged_attention_torch, store_kvcache_torch

TOL = {torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float16: 5e-3}


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def make_cache(num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int, dtype, gen):
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    return (
        torch.randn(shape, generator=gen).to(dtype),
        torch.randn(shape, generator=gen).to(dtype),
    )


def make_block_tables(
    context_lens: list[int],
    block_size: int,
    num_blocks: int,
    gen,
    width: int | None = None,
    pad: int = -1,
) -> torch.Tensor:
    """Shuffled (non-contiguous) distinct blocks per sequence, padded with `pad`."""
    need = [(n + block_size - 1) // block_size for n in context_lens]
    width = width or max(max(need), 1)
    perm = torch.randperm(num_blocks, generator=gen)
    if sum(need) > num_blocks:
        raise ValueError("test cache too small")
    tables = torch.full((len(context_lens), width), pad, dtype=torch.int32)
    used = 0
    for i, n in enumerate(need):
        tables[i, :n] = perm[used : used + n].int()
        used += n
    return tables


def poison_unused(
    k_cache: torch.Tensor, v_cache: torch.Tensor, tables: torch.Tensor, context_lens: list[int]
) -> None:
    """NaN into every cache slot no sequence may read: spare blocks (block 0 included) and block tails."""
    block_size = k_cache.shape[1]
    live = torch.zeros(k_cache.shape[:2], dtype=torch.bool)
    for row, n in zip(tables.tolist(), context_lens):
        for pos in range(n):
            live[row[pos // block_size], pos % block_size] = True
    k_cache[~live] = float("nan")
    v_cache[~live] = float("nan")


# ---------------------------------------------------------------- store_kvcache


@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_store_kvcache_matches_torch_and_skips_padded_slots(slot_dtype, dtype):
    gen = torch.Generator().manual_seed(1)
    num_blocks, block_size, hkv, d = 6, 16, 2, 32
    k_cache, v_cache = make_cache(num_blocks, block_size, hkv, d, dtype, gen)
    # key/value as strided views into a fused qkv buffer, like the model's split of qkv_proj
    qkv = torch.randn(9, (4 + 2 * hkv) * d, generator=gen).to(dtype)
    key = qkv[:, 4 * d : (4 + hkv) * d].view(9, hkv, d)
    value = qkv[:, (4 + hkv) * d :].view(9, hkv, d)
    slots = torch.tensor([3, -1, 17, 40, -1, 95, 16, 15, -1], dtype=slot_dtype)
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    store_kvcache_torch(key, value, ref_k, ref_v, slots)
    kernels.store_kvcache(key, value, k_cache, v_cache, slots)
    assert torch.equal(k_cache, ref_k) and torch.equal(v_cache, ref_v)


def test_store_kvcache_all_padded_leaves_cache_untouched():
    gen = torch.Generator().manual_seed(2)
    k_cache, v_cache = make_cache(4, 16, 4, 16, torch.float32, gen)
    before_k, before_v = k_cache.clone(), v_cache.clone()
    key = torch.randn(5, 4, 16, generator=gen)
    kernels.store_kvcache(
        key, key.clone(), k_cache, v_cache, torch.full((5,), -1, dtype=torch.int32)
    )
    assert torch.equal(k_cache, before_k) and torch.equal(v_cache, before_v)


def test_store_kvcache_rejects_mismatched_shapes():
    k_cache = torch.zeros(2, 16, 2, 16)
    with pytest.raises(ValueError, match="slot_mapping"):
        kernels.store_kvcache(
            torch.zeros(3, 2, 16),
            torch.zeros(3, 2, 16),
            k_cache,
            k_cache.clone(),
            torch.zeros(4, dtype=torch.int32),
        )


# ---------------------------------------------------------------- decode

DECODE_LENS = [1, 15, 16, 17, 31, 32, 33, 70]  # around block boundaries of 16 and 32, multi-block


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("group", [1, 2, 4])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_matches_torch(block_size, group, num_splits):
    gen = torch.Generator().manual_seed(block_size * 10 + group)
    hkv, d = 2, 32
    k_cache, v_cache = make_cache(24, block_size, hkv, d, torch.float32, gen)
    tables = make_block_tables(DECODE_LENS, block_size, 24, gen, width=6)
    poison_unused(k_cache, v_cache, tables, DECODE_LENS)
    lens = torch.tensor(DECODE_LENS, dtype=torch.int32)
    q = torch.randn(len(DECODE_LENS), group * hkv, d, generator=gen)
    out = kernels.paged_decode_attention(
        q, k_cache, v_cache, tables, lens, 0.2, num_splits=num_splits
    )
    cu = torch.arange(len(DECODE_LENS) + 1, dtype=torch.int32)
    ref = paged_attention_torch(q, k_cache, v_cache, tables, cu, lens, 0.2)
    assert rel_err(out, ref) < TOL[torch.float32]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_decode_half_precision(dtype):
    gen = torch.Generator().manual_seed(7)
    hkv, d, group = 2, 64, 4
    lens_list = [5, 33, 64, 100]
    k_cache, v_cache = make_cache(16, 32, hkv, d, dtype, gen)
    tables = make_block_tables(lens_list, 32, 16, gen)
    lens = torch.tensor(lens_list, dtype=torch.int32)
    q = torch.randn(len(lens_list), group * hkv, d, generator=gen).to(dtype)
    out = kernels.paged_decode_attention(q, k_cache, v_cache, tables, lens, d**-0.5, num_splits=2)
    cu = torch.arange(len(lens_list) + 1, dtype=torch.int32)
    ref = paged_attention_torch(
        q.float(), k_cache.float(), v_cache.float(), tables, cu, lens, d**-0.5
    )
    assert out.dtype == dtype
    assert rel_err(out, ref) < TOL[dtype]


@pytest.mark.parametrize("num_splits", [1, 4])
def test_decode_padded_entries_are_zero_and_never_read(num_splits):
    # CUDA-graph padding: context_len 0 and a table row of zeros (or -1) that must not be
    # dereferenced
    gen = torch.Generator().manual_seed(3)
    hkv, d, group = 2, 16, 2
    k_cache, v_cache = make_cache(8, 16, hkv, d, torch.float32, gen)
    tables = make_block_tables([20, 0, 0, 0], 16, 8, gen, width=4)
    tables[2] = 0
    poison_unused(k_cache, v_cache, tables, [20, 0, 0, 0])
    lens = torch.tensor([20, 0, 0, 0], dtype=torch.int32)
    q = torch.randn(4, group * hkv, d, generator=gen)
    out = kernels.paged_decode_attention(
        q, k_cache, v_cache, tables, lens, 0.25, num_splits=num_splits
    )
    ref = paged_attention_torch(
        q[:1], k_cache, v_cache, tables[:1], torch.arange(2, dtype=torch.int32), lens[:1], 0.25
    )
    assert torch.isfinite(out).all()
    assert torch.equal(out[1:], torch.zeros_like(out[1:]))
    assert rel_err(out[:1], ref) < TOL[torch.float32]


@pytest.mark.parametrize("num_splits", [2, 4, 5, 16])
def test_decode_one_launch_merge_repeats_exactly(num_splits):
    # the last split of each (seq, kv_head) merges in-kernel; a second call equal to the first
    # shows the arrival counters were reset (a stale count would merge early or never)
    gen = torch.Generator().manual_seed(20 + num_splits)
    hkv, d, group, block_size = 2, 32, 4, 16
    lens_list = [1, 16, 37, 70, 0]  # a padded entry last
    k_cache, v_cache = make_cache(16, block_size, hkv, d, torch.float32, gen)
    tables = make_block_tables(lens_list, block_size, 16, gen, width=5)
    poison_unused(k_cache, v_cache, tables, lens_list)
    lens = torch.tensor(lens_list, dtype=torch.int32)
    q = torch.randn(len(lens_list), group * hkv, d, generator=gen)
    first = kernels.paged_decode_attention(
        q, k_cache, v_cache, tables, lens, 0.2, num_splits=num_splits
    )
    counters = decode_module()._COUNTERS[torch.device("cpu")][-1]
    assert counters.numel() >= len(lens_list) * hkv
    assert not counters.any()  # every counter back at zero after the launch
    second = kernels.paged_decode_attention(
        q, k_cache, v_cache, tables, lens, 0.2, num_splits=num_splits
    )
    assert torch.equal(first, second)
    cu = torch.arange(5, dtype=torch.int32)
    ref = paged_attention_torch(q[:4], k_cache, v_cache, tables[:4], cu, lens[:4], 0.2)
    assert rel_err(first[:4], ref) < TOL[torch.float32]
    assert torch.equal(first[4], torch.zeros_like(first[4]))
    # a smaller batch reuses the same persistent counter buffer
    kernels.paged_decode_attention(
        q[:2], k_cache, v_cache, tables[:2], lens[:2], 0.2, num_splits=num_splits
    )
    assert decode_module()._COUNTERS[torch.device("cpu")][-1] is counters


def test_decode_counters_never_allocated_during_graph_capture(monkeypatch):
    decode = decode_module()
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    monkeypatch.setitem(decode._COUNTERS, torch.device("cuda", 0), [])
    with pytest.raises(RuntimeError, match="arrival counters"):
        decode._arrival_counters(torch.device("cuda", 0), 64)


def test_decode_rejects_bad_num_splits():
    with pytest.raises(ValueError, match="num_splits"):
        kernels.paged_decode_attention(
            torch.zeros(1, 2, 16),
            torch.zeros(1, 16, 1, 16),
            torch.zeros(1, 16, 1, 16),
            torch.zeros(1, 1, dtype=torch.int32),
            torch.ones(1, dtype=torch.int32),
            1.0,
            num_splits=0,
        )


def test_num_splits_rule_depends_on_shapes_only():
    cpu = torch.device("cpu")
    assert (
        kernels.choose_num_splits(256, 8, 4096, cpu) == 1
    )  # 2048 programs already fill 132 SMs twice
    assert kernels.choose_num_splits(1, 8, 4096, cpu) == 16
    assert kernels.choose_num_splits(16, 8, 4096, cpu) == 3
    assert kernels.choose_num_splits(1, 8, 256, cpu) == 1  # short max context: one share is enough


# ---------------------------------------------------------------- prefill / extend


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
    out = kernels.paged_prefill_attention(
        q, k_cache, v_cache, tables, cu, lens, max(q_lens), d**-0.5
    )
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
    out = kernels.paged_prefill_attention(q, k_cache, v_cache, tables, cu, lens, 10, 0.3)
    ref = paged_attention_torch(q, k_cache, v_cache, tables, cu, lens, 0.3)
    assert rel_err(out, ref) < TOL[torch.float32]


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
