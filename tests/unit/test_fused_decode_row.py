"""A decode row's fused kernels (each norm inside the GEMV after it, gate_up with its SiLU: CUDA
only, worker.layers.layernorm.RMSNorm.fused_linear and linear.gated_linear; the q/k norms, rotary
and KV store inside the decode attention: the Triton backend's Attention.decode_raw) run here by
Triton's interpreter in place of the CUDA-only dispatch: the engine still decodes as transformers
does."""

import pytest
import torch

from nanoserve.worker import LLM, SamplingParams
from nanoserve.worker.kernels import skinny_gemm as skinny_gemm_module
from nanoserve.worker.layers import layernorm, linear
from nanoserve.worker.layers.attention import Attention
from tests.unit.hf_reference import hf_greedy, make_hf_model, prompts_of
from tests.unit.interpreted_kernels import kernels  # noqa: F401 (interpreter + numpy shim)


def test_fused_decode_rows_decode_as_transformers(tmp_path, monkeypatch):
    # narrow layers: the interpreter runs each program of a kernel in Python
    hf = make_hf_model(
        tmp_path,
        tie_word_embeddings=True,
        intermediate_size=32,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
    )
    prompts = prompts_of([3, 20])
    ref = hf_greedy(hf, prompts, 5)

    def any_row(x: torch.Tensor, weight: torch.Tensor) -> bool:  # a CPU row too
        return x.dim() == 2 and x.shape[0] == 1 and weight.shape[0] <= linear.SKINNY_MAX_N

    calls = {"norm": 0, "gated": 0}
    fused = skinny_gemm_module.norm_skinny_gemm

    def counted(x, residual, norm_weight, eps, weight, gated=False):
        calls["gated" if gated else "norm"] += 1
        return fused(x, residual, norm_weight, eps, weight, gated)

    monkeypatch.setattr(linear, "takes_skinny", any_row)
    monkeypatch.setattr(layernorm, "takes_skinny", any_row)
    monkeypatch.setattr(skinny_gemm_module, "norm_skinny_gemm", counted)
    raw = Attention.decode_raw

    def counted_raw(self, q, new):
        calls["raw"] = calls.get("raw", 0) + 1
        return raw(self, q, new)

    monkeypatch.setattr(Attention, "decode_raw", counted_raw)
    # one sequence at a time: every decode step is one row
    llm = LLM(
        tmp_path,
        device="cpu",
        kvcache_block_size=16,
        num_kvcache_blocks=32,
        max_num_seqs=1,
        decode_fusions=True,
    )
    for layer in llm.model_runner.attention_layers:
        layer.backend = "triton"  # CUDA's attention kernels
    sp = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    out = llm.generate(prompts, sp, use_tqdm=False)
    assert [o.token_ids for o in out] == ref
    # 2 layers x 4 decode steps x 2 prompts, each layer's two norms fused
    assert calls["norm"] >= 2 * 4 * 2 and calls["gated"] == calls["norm"]
    assert calls["raw"] == 2 * 4 * 2  # every decode step's attention from the raw qkv
    assert llm.block_manager.num_free_blocks == llm.block_manager.num_blocks


@pytest.mark.parametrize("world", [2])
def test_no_fused_norm_across_ranks(monkeypatch, world):
    # under tensor parallelism the norm all-reduces first: the fused kernel never takes it
    monkeypatch.setattr(layernorm, "get_tp_world_size", lambda: world)
    monkeypatch.setattr(layernorm, "takes_skinny", lambda x, w: True)
    norm = layernorm.RMSNorm(8)
    norm.fuse_decode = True
    assert norm.fused_linear(torch.randn(1, 8), None, torch.randn(4, 8)) is None


def test_fusions_are_off_unless_asked_for(tmp_path, monkeypatch):
    # EngineConfig.decode_fusions (off by default: slower at batch 1 on the H100) reaches every
    # norm, MLP and attention layer of the model
    make_hf_model(tmp_path, num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    monkeypatch.setattr(layernorm, "takes_skinny", lambda x, w: True)  # as a CUDA row would
    for asked in (False, True):
        llm = LLM(tmp_path, device="cpu", num_kvcache_blocks=8, decode_fusions=asked)
        model = llm.model_runner.model
        flags = {m.fuse_decode for m in model.modules() if hasattr(m, "fuse_decode")}
        assert flags == {asked}
        row = torch.randn(1, model.model.norm.weight.shape[0])
        fused = model.model.norm.fused_linear(row, None, torch.randn(4, row.shape[1]))
        assert (fused is not None) == asked
