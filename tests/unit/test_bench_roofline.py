"""benchmarks/roofline.py's byte and FLOP accounting (checked against the hand count in
../shared/research/perf_anchors.md §5), its schedule simulation, and its step recorder on the real
engine (tiny model, CPU). The GPU figures come from `python -m nanoserve.benchmarks.roofline`."""

import json
import math

import pytest

from nanoserve.benchmarks import kernel_classes, roofline, roofline_kernels
from nanoserve.benchmarks.kernel_classes import gemm_ops, kernel_class
from nanoserve.benchmarks.roofline import Cost, Shape, simulate, step_cost
from nanoserve.benchmarks.roofline_kernels import gemm_op_costs

QWEN3_06B = Shape.named("qwen3-0.6b")


def test_shape_counts_match_the_hand_count():
    assert QWEN3_06B.linear_params == 440_401_920  # 28 x 15.73 M
    assert QWEN3_06B.lm_head_params == 151_936 * 1024
    assert QWEN3_06B.kv_bytes_per_token == 114_688  # 2 x 28 x 8 x 128 x 2 B


def test_decode_step_cost_by_hand():
    s = Shape(hidden=64, inter=128, layers=2, heads=4, kv_heads=2, head_dim=32, vocab=1000)
    c = step_cost(s, [(9, 1), (4, 1)])
    weights = 2 * (s.linear_params + s.lm_head_params)
    kv = s.kv_bytes_per_token
    logits = 2 * 2 * 1000 * 4  # two sequences' fp32 logits, written and read
    assert c.bytes == weights + (10 + 5) * kv + 2 * kv + 2 * s.act_bytes_per_token + logits
    attn = 4 * 4 * 32 * 2 * (9 + 1) + 4 * 4 * 32 * 2 * (4 + 1)  # one new token sees past + itself
    assert c.flops == 2 * 2 * s.linear_params + 2 * 2 * s.lm_head_params + attn
    assert c.bound_s == max(c.bytes / 4.3e12, c.flops / 790e12)
    assert (Cost(1, 2) + Cost(3, 4)) == Cost(4, 6)


def test_prefill_attention_is_causal():
    s = QWEN3_06B
    p = 1000
    c = step_cost(s, [(0, p)], sampled=1)
    attn = c.flops - 2 * p * s.linear_params - 2 * s.lm_head_params
    assert attn == pytest.approx(4 * 16 * 128 * 28 * p * (p + 1) / 2)
    # chunked in two halves: the same attention work in all
    a, b = step_cost(s, [(0, 500)], sampled=0), step_cost(s, [(500, 500)], sampled=1)
    assert a.flops + b.flops == pytest.approx(c.flops)


def test_the_nano_vllm_workload_at_the_speed_of_light():
    work = roofline.nano_vllm_workload()
    assert sum(o for _, o in work) == 138_985  # benchmarks.engine throughput's output tokens
    steps = simulate(work, 16384, 512)
    prompt_tokens = sum(p for p, _ in work)
    prefill = [s for s in steps if roofline.phase_of(s, 256) == "prefill"]
    assert sum(new for s in prefill for _, new in s["items"]) == prompt_tokens
    assert len(prefill) == math.ceil(prompt_tokens / 16384)
    assert len(steps) - len(prefill) == max(o for _, o in work) - 1
    acc = roofline.account(QWEN3_06B, steps)
    assert acc["total"]["output_tokens"] == 138_985
    # perf_anchors §5 puts this workload's speed of light at ≈36,000 output tok/s on the H200
    assert acc["total"]["speed_of_light_tok_s"] == pytest.approx(36_000, rel=0.03)
    assert set(acc) == {"prefill", "decode_full", "decode_shrinking", "decode_tail", "total"}
    assert acc["decode_full"]["steps"] == min(o for _, o in work) - 1


def test_kernel_classes():
    assert kernel_class("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x64x64") == "gemm"
    assert kernel_class("_decode_attention_kernel") == "attention"
    # worker/kernels' own Triton kernels
    assert kernel_class("_decode_split_kernel") == "attention"
    assert (
        kernel_class("_qk_norm_rope_kernel") == kernel_class("_store_kvcache_kernel") == "rope_kv"
    )
    assert kernel_class("_allreduce_add_rms_norm_kernel") == "allreduce"
    assert kernel_class("_skinny_gemm_kernel") == "gemm"
    assert kernel_class("_fused_qk_norm_rope_store_kernel") == "rope_kv"
    assert kernel_class("_rms_norm_kernel") == "norm"
    assert kernel_class("_silu_and_mul_kernel") == "activation"
    assert kernel_class("void at::native::reduce_kernel<argmax>") == "sampling"
    assert kernel_class("ncclDevKernel_AllReduce_Sum_bf16_RING_LL") == "allreduce"
    assert kernel_class("Memcpy HtoD") == "other"
    costs = roofline_kernels.class_costs(QWEN3_06B, 256, 1024)
    # at B=256 the decode step is KV-bandwidth-bound: attention is most of its bound
    total = sum(costs.values(), Cost(0, 0))
    assert costs["attention"].bytes > 0.9 * (total.bytes - costs["gemm"].bytes)
    assert costs["attention"].bound_s > 10 * costs["gemm"].bound_s


def test_recorded_steps_of_the_real_engine(tiny_model_dir):
    from nanoserve.worker import LLM

    llm = LLM(str(tiny_model_dir), device="cpu", kvcache_block_size=16, num_kvcache_blocks=64)
    try:
        shape = Shape(hidden=64, inter=128, layers=2, heads=4, kv_heads=2, head_dim=32)
        acc = roofline.measure_phases(llm, shape, [(10, 4), (20, 6), (15, 3)])
        assert "step" not in vars(llm) and "schedule" not in vars(llm.scheduler)  # unwrapped
    finally:
        llm.shutdown()
    assert acc["prefill"]["steps"] == 1 and acc["prefill"]["output_tokens"] == 3
    assert acc["total"]["output_tokens"] == 4 + 6 + 3
    assert acc["decode_full"]["steps"] == 2  # all three decode until the 3-token one ends
    assert 0 < acc["total"]["seconds"] <= acc["total"]["wall_s"] * 1.01
    assert acc["total"]["bound_s"] > 0 and "fraction_of_bound" in acc["decode_full"]


def test_profiled_decode_step_accounts_every_class(tiny_model_dir):
    from nanoserve.worker import LLM

    llm = LLM(str(tiny_model_dir), device="cpu", kvcache_block_size=16, num_kvcache_blocks=64)
    try:
        shape = Shape(hidden=64, inter=128, layers=2, heads=4, kv_heads=2, head_dim=32)
        res = roofline_kernels.profile_decode(llm, shape, batch=2, context=20, steps=3)
        assert llm.is_finished()
    finally:
        llm.shutdown()
    assert (res["batch"], res["context"]) == (2, 20)
    assert res["wall_us_per_step"] > 0 and res["step_bound_us"] > 0
    assert res["kernels"] and sum(c["us_per_step"] for c in res["classes"].values()) > 0
    for k in res["kernels"]:
        assert k["cls"] in res["classes"]
    # the tiny model's four linear layers a layer, and its LM head, are told apart on CPU too
    assert {"qkv", "o_proj", "gate_up", "down", "lm_head"} <= set(res["gemm_ops"]), res["gemm_ops"]
    assert res["gemm_ops"]["qkv"]["calls_per_step"] == shape.layers


def test_gemms_are_named_by_their_neighbours():
    layer = [
        "rms_norm",
        "gemm_a",
        "splitKreduce",
        "qk_norm_rope_store",
        "decode_attention",
        "gemm_b",
        "nccl_allreduce",
        "add_rms_norm",
        "gemm_c",
        "silu_and_mul",
        "gemm_d",
        "elementwise_add",
    ]
    fused_tp = ["gemm_b2", "allreduce_add_rms_norm", "gemm_c2", "silu_and_mul"]  # o, then gate_up
    seq = [
        (name, 1.0)
        for name in ["embedding_gather", *layer, *layer, "rms_norm", "gemm_e", "sample_argmax"]
    ]
    ops = gemm_ops(seq)
    assert gemm_ops([("decode_attention", 1.0)] + [(n, 1.0) for n in fused_tp]) == {
        "o_proj": {"us": 1.0, "calls": 1},
        "gate_up": {"us": 1.0, "calls": 1},
    }
    assert ops == {
        "qkv": {"us": 4.0, "calls": 2},
        "o_proj": {"us": 2.0, "calls": 2},
        "gate_up": {"us": 2.0, "calls": 2},
        "down": {"us": 2.0, "calls": 2},
        "lm_head": {"us": 1.0, "calls": 1},
    }
    costs = gemm_op_costs(QWEN3_06B, 1)
    weights = sum(c.bytes for c in costs.values())
    # at batch 1 the GEMMs read every weight once, the 1.19 GB of perf_anchors §5, and the
    # activations (the fp32 logits most: 0.6 MB) add little
    params = QWEN3_06B.linear_params + QWEN3_06B.lm_head_params
    assert 0 < weights - 2 * params < 2e6
    assert costs["down"].flops == 2 * 28 * 3072 * 1024


def test_analytic_run_prints_json_that_the_gpu_table_reads(tmp_path, capsys):
    from nanoserve.benchmarks import gpu_table

    roofline.main(["--analytic", "--json"])
    line = capsys.readouterr().out.strip()
    assert json.loads(line)["total"]["speed_of_light_tok_s"] > 30_000
    (tmp_path / "roofline.log").write_text(line + "\n")
    gpu_table.main([str(tmp_path)])
    table = capsys.readouterr().out
    assert "roofline qwen3-0.6b" in table and "decode_tail" in table


def test_idle_gaps_name_the_kernels_around_them():
    spans = [  # (start, end, name) µs over two steps; overlapping kernels leave no gap
        (0.0, 10.0, "rms_norm"),
        (12.0, 20.0, "gemm_a"),
        (18.0, 30.0, "decode_attention"),
        (30.5, 40.0, "gemm_b"),  # 0.5 µs: under min_us, not counted
        (100.0, 110.0, "rms_norm"),  # 60 µs after the last kernel: a host stall
        (113.0, 120.0, "gemm_a"),
    ]
    res = kernel_classes.idle_gaps(list(reversed(spans)), steps=2)
    assert res["idle_us_per_step"] == round((2 + 60 + 3) / 2, 1)
    sites = {s["site"]: s for s in res["sites"]}
    assert sites["gemm -> norm"]["us_per_step"] == 30.0
    assert sites["norm -> gemm"] == dict(site="norm -> gemm", us_per_step=2.5, gaps_per_step=1.0)
    assert res["sites"][0]["site"] == "gemm -> norm"  # the largest first
    assert res["short_gaps_us_per_step"] == 0.25  # the 0.5 µs gap, over two steps
    assert res["kernels_per_step"] == 3.0
    empty = kernel_classes.idle_gaps([], steps=1)
    assert (empty["idle_us_per_step"], empty["sites"], empty["kernels_per_step"]) == (0.0, [], 0)


def test_profiled_mixed_decode_reports_its_mean_context(tiny_model_dir):
    from nanoserve.worker import LLM

    llm = LLM(str(tiny_model_dir), device="cpu", kvcache_block_size=16, num_kvcache_blocks=64)
    try:
        shape = Shape(hidden=64, inter=128, layers=2, heads=4, kv_heads=2, head_dim=32)
        res = roofline_kernels.profile_decode(llm, shape, batch=3, context=60, steps=2, mixed=True)
        assert llm.is_finished()
    finally:
        llm.shutdown()
    assert res["mixed"] and 100 <= res["mean_context"] <= 120 and res["step_bound_us"] > 0
    # CPU: no kernel timeline
    assert (res["idle"]["idle_us_per_step"], res["idle"]["kernels_per_step"]) == (0.0, 0.0)


def test_profiled_prefill_step_accounts_its_kernels(tiny_model_dir, tmp_path, capsys):
    from nanoserve.benchmarks import gpu_table
    from nanoserve.worker import LLM

    llm = LLM(str(tiny_model_dir), device="cpu", kvcache_block_size=16, num_kvcache_blocks=256)
    try:
        shape = Shape(hidden=64, inter=128, layers=2, heads=4, kv_heads=2, head_dim=32)
        res = roofline_kernels.profile_prefill(llm, shape, tokens=300, repeats=2)
        assert llm.is_finished()
    finally:
        llm.shutdown()
    assert res["tokens"] == 300 and res["wall_us_per_step"] > 0 and res["host_prepare_us"] > 0
    expected = res["step_bound_us"] / res["wall_us_per_step"]
    assert res["step_bound_us"] > 0 and abs(res["fraction_of_bound"] - expected) < 1e-3
    assert res["classes"] and res["kernels"]
    assert "gemm" in res["classes"] and res["classes"]["gemm"]["bound_us"] > 0
    line = json.dumps(dict(bench="roofline_prefill", model="tiny", **res))
    (tmp_path / "roofline.log").write_text(line + "\n")
    gpu_table.main([str(tmp_path)])
    assert "roofline prefill 300 tokens" in capsys.readouterr().out
