"""Tensor parallelism on two GPUs (NCCL): bf16 logits and greedy tokens of size 2 agree with size 1."""

import pytest
import torch

from tests.gpu.test_engine_gpu import (
    first_divergence_is_a_near_tie,
    free,
    make_llm,
    prompts,
    teacher_forced_logits,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 GPUs"
    ),
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from tests.gpu.test_engine_gpu import SHAPE

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("qwen3-0.6b-tp")
    model = Qwen3ForCausalLM(Qwen3Config(**SHAPE, torch_dtype="bfloat16"))
    with torch.no_grad():
        model.model.embed_tokens.weight.normal_(0, 0.5)
    model.to(torch.bfloat16).save_pretrained(path, safe_serialization=True)
    return path


def run(path, tp: int, ps):
    from nanoserve.worker import SamplingParams

    llm = make_llm(path, tensor_parallel_size=tp, enforce_eager=False)
    logits = [teacher_forced_logits(llm, p) for p in ps[:3]]
    sp = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    tokens = [o.token_ids for o in llm.generate(ps, sp, use_tqdm=False)]
    return llm, logits, tokens


def test_tp2_matches_tp1(model_dir, capsys):
    ps = prompts(24, 20, 400, seed=5)
    llm1, logits1, tokens1 = run(model_dir, 1, ps)
    llm2, logits2, tokens2 = run(model_dir, 2, ps)
    agree = sum((a.argmax(-1) == b.argmax(-1)).sum().item() for a, b in zip(logits1, logits2))
    total = sum(len(a) for a in logits1)
    max_err = max((a - b).abs().max().item() for a, b in zip(logits1, logits2))
    scale = max(a.abs().max().item() for a in logits1)
    differ = [i for i, (a, b) in enumerate(zip(tokens2, tokens1)) if a != b]
    gaps = [first_divergence_is_a_near_tie(llm1, ps[i], tokens2[i], tokens1[i]) for i in differ]
    free(llm2)
    free(llm1)
    with capsys.disabled():
        print(
            f"\n[gpu] tp2 vs tp1 bf16: top-1 agreement {agree / total:.4f}, max |logit diff| "
            f"{max_err:.3f} (logits up to {scale:.1f}); greedy: {len(differ)} of {len(ps)} "
            f"sequences diverge, gaps (bf16 ulps) {[round(g, 3) for g in gaps]}"
        )
    assert agree / total >= 0.99 and max_err <= 0.05 * scale
    assert len(differ) <= len(ps) // 10 and all(g <= 2 for g in gaps)


def test_all_reduce_paths_give_exact_sums():
    """nanoserve.benchmarks.allreduce on 2 GPUs: NCCL, the one-shot kernel and the fused all-reduce + add +
    RMSNorm (16 chained calls, slots alternating) give the same bits, at the sizes the model fuses."""
    import json
    import subprocess
    import sys

    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "nanoserve.benchmarks.allreduce",
            "--rows",
            "1",
            "16",
            "--max-rows",
            "16",
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert [r["rows"] for r in rows] == [1, 16]
    assert all(r["exact"] and r["fused_exact"] for r in rows), rows
