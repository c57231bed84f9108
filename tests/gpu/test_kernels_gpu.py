"""nanoserve.worker.kernels on CUDA at Qwen3 shapes against the torch reference, plus CUDA-graph capture/replay
of a decode step (fused q/k-norm + rotary + KV store, one-launch decode attention)."""

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

if torch.cuda.is_available():
    from nanoserve.worker.kernels import (
        fused_add_rms_norm,
        paged_decode_attention,
        paged_prefill_attention,
        qk_norm_rope,
        rms_norm,
        silu_and_mul,
        store_kvcache,
    )
from nanoserve.worker.layers.attention import paged_attention_torch, store_kvcache_torch
from nanoserve.worker.layers.rotary_embedding import RotaryEmbedding

# (num_q_heads, num_kv_heads, head_dim): Qwen3-0.6B, Qwen3-8B
SHAPES = {"qwen3-0.6b": (16, 8, 128), "qwen3-8b": (32, 8, 128)}
TOL = {torch.float32: 1e-4, torch.bfloat16: 1e-2, torch.float16: 2e-3}
BLOCK_SIZE = 256


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def make_case(
    context_lens: list[int],
    hkv: int,
    d: int,
    dtype,
    gen,
    block_size: int = BLOCK_SIZE,
    width: int = 16,
):
    """Random caches with NaN in every slot no sequence owns, and shuffled block tables padded with -1."""
    need = [(n + block_size - 1) // block_size for n in context_lens]
    num_blocks = sum(need) + 4
    shape = (num_blocks, block_size, hkv, d)
    k_cache = torch.randn(shape, generator=gen, device="cuda").to(dtype)
    v_cache = torch.randn(shape, generator=gen, device="cuda").to(dtype)
    perm = torch.randperm(num_blocks, generator=gen, device="cuda").int()
    tables = torch.full(
        (len(context_lens), max(width, max(need))), -1, dtype=torch.int32, device="cuda"
    )
    live = torch.zeros(num_blocks, block_size, dtype=torch.bool, device="cuda")
    used = 0
    for i, (n, nb) in enumerate(zip(context_lens, need)):
        tables[i, :nb] = perm[used : used + nb]
        live.view(-1)[
            (
                perm[used : used + nb].long()[:, None] * block_size
                + torch.arange(block_size, device="cuda")
            ).flatten()[:n]
        ] = True
        used += nb
    k_cache[~live] = float("nan")
    v_cache[~live] = float("nan")
    lens = torch.tensor(context_lens, dtype=torch.int32, device="cuda")
    return k_cache, v_cache, tables, lens


def reference(q, k_cache, v_cache, tables, cu, lens, scale):
    return paged_attention_torch(
        q.float(), k_cache.float(), v_cache.float(), tables, cu, lens, scale
    )


@pytest.mark.parametrize("model", list(SHAPES))
@pytest.mark.parametrize("batch", [1, 7, 64, 256])
@pytest.mark.parametrize("num_splits", [None, 1, 8])
def test_decode_bf16_real_shapes(model, batch, num_splits):
    hq, hkv, d = SHAPES[model]
    gen = torch.Generator(device="cuda").manual_seed(batch)
    lens_list = torch.randint(1, 4096, (batch,), generator=gen, device="cuda").tolist()
    lens_list[:4] = [1, 255, 256, 257][:batch]
    k_cache, v_cache, tables, lens = make_case(lens_list, hkv, d, torch.bfloat16, gen)
    q = torch.randn(batch, hq, d, generator=gen, device="cuda").to(torch.bfloat16)
    out = paged_decode_attention(q, k_cache, v_cache, tables, lens, d**-0.5, num_splits=num_splits)
    cu = torch.arange(batch + 1, dtype=torch.int32, device="cuda")
    assert (
        rel_err(out, reference(q, k_cache, v_cache, tables, cu, lens, d**-0.5))
        < TOL[torch.bfloat16]
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_decode_other_dtypes(dtype):
    hq, hkv, d = SHAPES["qwen3-0.6b"]
    gen = torch.Generator(device="cuda").manual_seed(11)
    lens_list = [1, 300, 1024, 2000]
    k_cache, v_cache, tables, lens = make_case(lens_list, hkv, d, dtype, gen)
    q = torch.randn(4, hq, d, generator=gen, device="cuda").to(dtype)
    out = paged_decode_attention(q, k_cache, v_cache, tables, lens, d**-0.5)
    cu = torch.arange(5, dtype=torch.int32, device="cuda")
    assert rel_err(out, reference(q, k_cache, v_cache, tables, cu, lens, d**-0.5)) < TOL[dtype]


@pytest.mark.parametrize("model", list(SHAPES))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_prefill_and_extend_real_shapes(model, dtype):
    hq, hkv, d = SHAPES[model]
    gen = torch.Generator(device="cuda").manual_seed(3)
    # full prompts, block-boundary prompts, and extends after a cached prefix (prefix hits,
    # chunked prefill)
    q_lens = [1, 255, 256, 257, 1000, 17, 300, 64]
    context_lens = [1, 255, 256, 257, 1000, 530, 2348, 64 + 256]
    k_cache, v_cache, tables, lens = make_case(context_lens, hkv, d, dtype, gen)
    cu = torch.tensor(
        [0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda"
    )
    q = torch.randn(sum(q_lens), hq, d, generator=gen, device="cuda").to(dtype)
    out = paged_prefill_attention(q, k_cache, v_cache, tables, cu, lens, d**-0.5)
    assert rel_err(out, reference(q, k_cache, v_cache, tables, cu, lens, d**-0.5)) < TOL[dtype]


def test_store_kvcache_real_shapes_skips_padded_slots():
    _, hkv, d = SHAPES["qwen3-8b"]
    gen = torch.Generator(device="cuda").manual_seed(5)
    k_cache = torch.randn(64, BLOCK_SIZE, hkv, d, generator=gen, device="cuda").to(torch.bfloat16)
    v_cache = torch.randn_like(k_cache)
    n = 4000
    slots = torch.randperm(64 * BLOCK_SIZE, generator=gen, device="cuda")[:n].int()
    slots[::7] = -1
    key = torch.randn(n, hkv, d, generator=gen, device="cuda").to(torch.bfloat16)
    value = torch.randn_like(key)
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    store_kvcache_torch(key, value, ref_k, ref_v, slots)
    store_kvcache(key, value, k_cache, v_cache, slots)
    torch.cuda.synchronize()
    assert torch.equal(k_cache, ref_k) and torch.equal(v_cache, ref_v)


@pytest.mark.parametrize("num_splits", [2, 8, 16])
@pytest.mark.parametrize("batch", [1, 3, 40])
def test_decode_in_kernel_merge_is_deterministic(num_splits, batch):
    """The last split program merges: many launches in a row give bit-identical outputs (a missed
    partial, a stale L1 read or a counter left non-zero would show as a differing or garbage row)."""
    hq, hkv, d = SHAPES["qwen3-8b"]
    gen = torch.Generator(device="cuda").manual_seed(num_splits * 100 + batch)
    lens_list = torch.randint(1, 4096, (batch,), generator=gen, device="cuda").tolist()
    lens_list[-1] = 0 if batch > 1 else lens_list[-1]  # a padded entry
    k_cache, v_cache, tables, lens = make_case(lens_list, hkv, d, torch.bfloat16, gen)
    q = torch.randn(batch, hq, d, generator=gen, device="cuda").to(torch.bfloat16)
    outs = [
        paged_decode_attention(q, k_cache, v_cache, tables, lens, d**-0.5, num_splits=num_splits)
        for _ in range(50)
    ]
    torch.cuda.synchronize()
    for out in outs[1:]:
        assert torch.equal(out, outs[0])
    real = [i for i, n in enumerate(lens_list) if n > 0]
    cu = torch.arange(len(real) + 1, dtype=torch.int32, device="cuda")
    ref = reference(q[real], k_cache, v_cache, tables[real], cu, lens[real], d**-0.5)
    assert rel_err(outs[0][real], ref) < TOL[torch.bfloat16]
    if len(real) < batch:
        assert torch.equal(outs[0][-1], torch.zeros_like(outs[0][-1]))
    from nanoserve.worker.kernels.arrival import _COUNTERS

    assert not _COUNTERS[q.device][-1].any()  # every counter reset for the next launch


@pytest.mark.parametrize(
    "model, cache_dtype",
    [("qwen3-0.6b", torch.bfloat16), ("qwen3-8b", torch.bfloat16), ("qwen3-0.6b", "fp8")],
)
@pytest.mark.parametrize("batch", [1, 7, 64, 256])
def test_raw_decode_equals_norm_rope_then_attention(model, cache_dtype, batch):
    """The decode attention given the raw q, k, v (NewTokens: its prologue normalises, rotates and
    stores) against qk_norm_rope's store and then the attention: the same cache and output bits."""
    from nanoserve.worker.kernels.decode_attention import NewTokens

    hq, hkv, d = SHAPES[model]
    fp8 = cache_dtype == "fp8"
    gen = torch.Generator(device="cuda").manual_seed(batch + hq)
    lens_list = torch.randint(1, 4096, (batch,), generator=gen, device="cuda").tolist()
    lens_list[:4] = [1, 255, 256, 257][:batch]
    k_cache, v_cache, tables, lens = make_case(lens_list, hkv, d, torch.bfloat16, gen)
    scales = (0.5, 2.0) if fp8 else (1.0, 1.0)
    if fp8:
        k_cache, v_cache = k_cache.to(torch.float8_e4m3fn), v_cache.to(torch.float8_e4m3fn)
    qkv = (3 * torch.randn(batch, (hq + 2 * hkv) * d, generator=gen, device="cuda")).bfloat16()
    q_w = (1 + 0.1 * torch.randn(d, generator=gen, device="cuda")).bfloat16()
    k_w = (1 + 0.1 * torch.randn(d, generator=gen, device="cuda")).bfloat16()
    cos_sin = RotaryEmbedding(d, 40960, 1e6).cache_on(torch.device("cuda"))
    positions = lens.long() - 1
    slots = torch.tensor(
        [int(tables[i, (n - 1) // BLOCK_SIZE]) * BLOCK_SIZE + (n - 1) % BLOCK_SIZE
         for i, n in enumerate(lens_list)],
        dtype=torch.int32,
        device="cuda",
    )  # fmt: skip

    def views(x):
        q, k, v = x.split([hq * d, hkv * d, hkv * d], dim=-1)
        return q.view(batch, hq, d), k.view(batch, hkv, d), v.view(batch, hkv, d)

    ref_qkv, ref_k_cache, ref_v_cache = qkv.clone(), k_cache.clone(), v_cache.clone()
    q, k, v = views(ref_qkv)
    qk_norm_rope(
        q, k, q_w, k_w, cos_sin, positions, 1e-6,
        v=v, k_cache=ref_k_cache, v_cache=ref_v_cache, slot_mapping=slots,
        k_scale=scales[0], v_scale=scales[1],
    )  # fmt: skip
    ref = paged_decode_attention(
        q, ref_k_cache, ref_v_cache, tables, lens, d**-0.5, k_scale=scales[0], v_scale=scales[1]
    )
    raw_q, raw_k, raw_v = views(qkv)
    new = NewTokens(raw_k, raw_v, q_w, k_w, cos_sin, positions, slots, 1e-6)
    out = paged_decode_attention(
        raw_q, k_cache, v_cache, tables, lens, d**-0.5, k_scale=scales[0], v_scale=scales[1],
        new=new,
    )  # fmt: skip
    torch.cuda.synchronize()
    # (fp8 bytes compared as bytes: NaN slots compare unequal as floats)
    assert torch.equal(k_cache.view(torch.uint8), ref_k_cache.view(torch.uint8))
    assert torch.equal(v_cache.view(torch.uint8), ref_v_cache.view(torch.uint8))
    assert torch.equal(out, ref)


@pytest.mark.parametrize("num_splits", [None, 1, 8])
def test_decode_cuda_graph_replay(num_splits):
    """Capture the fused q/k-norm + rotary + KV store and the one-launch decode once, then replay
    with other context lengths, tables and padding (the ModelRunner decode step of one layer)."""
    hq, hkv, d = SHAPES["qwen3-0.6b"]
    batch, width = 32, 16
    gen = torch.Generator(device="cuda").manual_seed(9)
    k_cache = torch.randn(batch * width + 1, BLOCK_SIZE, hkv, d, generator=gen, device="cuda").to(
        torch.bfloat16
    )
    v_cache = torch.randn_like(k_cache)
    cos_sin = RotaryEmbedding(d, width * BLOCK_SIZE, 1e6).cache_on(torch.device("cuda"))
    q_w = (1 + 0.1 * torch.randn(d, generator=gen, device="cuda")).to(torch.bfloat16)
    k_w = (1 + 0.1 * torch.randn(d, generator=gen, device="cuda")).to(torch.bfloat16)
    # graph inputs: static buffers rewritten in place before each replay (the ModelRunner
    # pattern); qkv is the raw projection, normed in place inside the graph
    raw = torch.zeros(batch, (hq + 2 * hkv) * d, dtype=torch.bfloat16, device="cuda")
    qkv = torch.zeros_like(raw)
    q, key, value = (x.view(batch, -1, d) for x in qkv.split([hq * d, hkv * d, hkv * d], dim=-1))
    positions = torch.zeros(batch, dtype=torch.long, device="cuda")
    slots = torch.full((batch,), -1, dtype=torch.int32, device="cuda")
    lens = torch.zeros(batch, dtype=torch.int32, device="cuda")
    tables = torch.zeros(batch, width, dtype=torch.int32, device="cuda")

    def step() -> torch.Tensor:
        qkv.copy_(raw)
        qk_norm_rope(
            q,
            key,
            q_w,
            k_w,
            cos_sin,
            positions,
            1e-6,
            v=value,
            k_cache=k_cache,
            v_cache=v_cache,
            slot_mapping=slots,
        )
        return paged_decode_attention(
            q, k_cache, v_cache, tables, lens, d**-0.5, num_splits=num_splits
        )

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # compile, size the arrival counters and warm up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()

    for trial in range(3):
        real = [8, 20, 32][trial]  # the rest are padded entries: context 0, slot -1, table row 0
        lens_list = torch.randint(
            1, width * BLOCK_SIZE, (real,), generator=gen, device="cuda"
        ).tolist()
        perm = (
            torch.randperm(batch * width, generator=gen, device="cuda").int() + 1
        )  # block 0 stays spare
        tables.zero_()
        lens.zero_()
        slots.fill_(-1)
        positions.zero_()
        for i, n in enumerate(lens_list):
            nb = (n + BLOCK_SIZE - 1) // BLOCK_SIZE
            tables[i, :nb] = perm[i * width : i * width + nb]
            lens[i] = n
            positions[i] = n - 1
            slots[i] = tables[i, (n - 1) // BLOCK_SIZE] * BLOCK_SIZE + (n - 1) % BLOCK_SIZE
        raw.copy_(torch.randn(raw.shape, generator=gen, device="cuda"))
        spare = k_cache[0].clone()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(k_cache[0], spare)  # padded slots wrote nothing into block 0
        flat_k, flat_v = k_cache.view(-1, hkv, d), v_cache.view(-1, hkv, d)
        live = slots[:real].long()
        assert torch.equal(flat_k[live], key[:real]) and torch.equal(flat_v[live], value[:real])
        cu = torch.arange(real + 1, dtype=torch.int32, device="cuda")
        ref = reference(q[:real], k_cache, v_cache, tables[:real], cu, lens[:real], d**-0.5)
        assert rel_err(out[:real], ref) < TOL[torch.bfloat16]
        assert torch.equal(out[real:], torch.zeros_like(out[real:]))
        eager = step()
        assert torch.equal(out, eager)  # replay computes exactly what an eager launch computes


@pytest.mark.parametrize("hidden", [1024, 4096])
def test_fused_norms_and_silu_real_shapes(hidden):
    gen = torch.Generator(device="cuda").manual_seed(hidden)
    x = torch.randn(300, hidden, generator=gen, device="cuda").to(torch.bfloat16)
    residual = torch.randn_like(x)
    weight = (1 + 0.1 * torch.randn(hidden, generator=gen, device="cuda")).to(torch.bfloat16)
    out, new_residual = fused_add_rms_norm(x, residual, weight, 1e-6)
    summed = (x.float() + residual.float()).to(torch.bfloat16)
    assert torch.equal(new_residual, summed)
    sf = summed.float()
    ref = (sf * torch.rsqrt(sf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(torch.bfloat16) * weight
    assert rel_err(out, ref) < 1e-2
    assert rel_err(rms_norm(summed, weight, 1e-6), ref) < 1e-2
    gate_up = torch.randn(300, 2 * 3072, generator=gen, device="cuda").to(torch.bfloat16)
    gate, up = gate_up.float().chunk(2, -1)
    assert rel_err(silu_and_mul(gate_up), torch.nn.functional.silu(gate) * up) < 1e-2


@pytest.mark.parametrize("inter, hidden", [(3072, 1024), (12288, 4096)])
def test_gated_skinny_gemm_is_gate_up_then_silu(inter, hidden):
    # one decode row: the MLP's gate_up GEMV with its SiLU fused (worker.layers.linear.gated_linear)
    from nanoserve.worker.kernels.skinny_gemm import skinny_gemm

    gen = torch.Generator(device="cuda").manual_seed(inter)
    x = torch.randn(1, hidden, generator=gen, device="cuda").to(torch.bfloat16)
    w = (0.02 * torch.randn(2 * inter, hidden, generator=gen, device="cuda")).to(torch.bfloat16)
    fused = skinny_gemm(x, w, gated=True)
    assert fused.shape == (1, inter)
    gate, up = (x.float() @ w.float().t()).chunk(2, -1)
    assert rel_err(fused, torch.nn.functional.silu(gate) * up) < 1e-2
    assert rel_err(fused, silu_and_mul(skinny_gemm(x, w))) < 1e-2


@pytest.mark.parametrize("with_residual", [True, False])
@pytest.mark.parametrize(
    "n, hidden, gated", [(4096, 1024, False), (6144, 1024, True), (6144, 4096, False)]
)
def test_norm_fused_skinny_gemm_real_shapes(with_residual, n, hidden, gated):
    # one decode row: the RMSNorm (and its residual add) inside the GEMV after it (0.6B's qkv and
    # gate_up, 8B's qkv; RMSNorm.fused_linear)
    from nanoserve.worker.kernels.skinny_gemm import norm_skinny_gemm, skinny_gemm

    gen = torch.Generator(device="cuda").manual_seed(n + hidden)
    x = torch.randn(1, hidden, generator=gen, device="cuda").to(torch.bfloat16)
    residual = torch.randn_like(x) if with_residual else None
    norm_w = (1 + 0.1 * torch.randn(hidden, generator=gen, device="cuda")).to(torch.bfloat16)
    w = (0.02 * torch.randn(n, hidden, generator=gen, device="cuda")).to(torch.bfloat16)
    y, new_residual = norm_skinny_gemm(x, residual, norm_w, 1e-6, w, gated=gated)
    if residual is None:
        h, expected = rms_norm(x, norm_w, 1e-6), x
    else:
        h, expected = fused_add_rms_norm(x, residual, norm_w, 1e-6)
    assert torch.equal(new_residual, expected)
    ref = skinny_gemm(h, w, gated=gated)
    assert y.shape == ref.shape
    assert rel_err(y, ref) < 1e-2
