"""kv_cache_dtype=fp8 on CUDA (Qwen3-0.6B shapes, random weights): teacher-forced logits over an fp8
(e4m3, per-tensor scale 1.0) KV cache against the bf16 cache: top-1 agreement and the largest logit
difference, printed; decode through the graphs runs on the fp8 cache too."""

import random

import pytest
import torch

from tests.gpu.test_engine_gpu import free, hf_model, make_llm, teacher_forced_logits  # noqa: F401

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def test_fp8_cache_keeps_top1_and_logits_close(hf_model, capsys):
    path, _ = hf_model
    rng = random.Random(5)
    prompts = [[rng.randrange(151643) for _ in range(n)] for n in (17, 300, 1200)]
    logits = {}
    for kv in ("auto", "fp8"):
        llm = make_llm(path, kv_cache_dtype=kv)
        assert llm.model_runner.kv_cache.dtype == (
            torch.float8_e4m3fn if kv == "fp8" else torch.bfloat16
        )
        logits[kv] = [teacher_forced_logits(llm, p) for p in prompts]
        if kv == "fp8":  # decode steps (CUDA graphs) over the fp8 cache
            from nanoserve.worker import SamplingParams

            out = llm.generate(
                prompts,
                SamplingParams(temperature=0, max_tokens=16, ignore_eos=True),
                use_tqdm=False,
            )
            assert all(len(o.token_ids) == 16 for o in out)
        free(llm)
    ref, got = torch.cat(logits["auto"]), torch.cat(logits["fp8"])
    agree = (ref.argmax(-1) == got.argmax(-1)).float().mean().item()
    max_diff = (ref - got).abs().max().item()
    scale = ref.abs().max().item()
    with capsys.disabled():
        print(
            f"\n[gpu] fp8 KV cache vs bf16: top-1 agreement {agree:.4f} over {ref.shape[0]} "
            f"positions, max |logit diff| {max_diff:.3f} (max |logit| {scale:.1f})"
        )
    assert agree >= 0.95
    assert max_diff <= 0.1 * scale
