"""Qwen3ForCausalLM against transformers' implementation: teacher-forced logits through a real paged
KV cache (prefill, chunked prefill over a cached prefix, decode), and tensor parallelism (gloo)."""

import os
import random

import pytest
import torch
import torch.multiprocessing as mp

from nanoserve.worker.layers.attention import Attention
from nanoserve.worker.layers.context import reset_context, set_context
from nanoserve.worker.model.config import ModelConfig
from nanoserve.worker.model.loader import load_model
from nanoserve.worker.model.qwen3 import Qwen3ForCausalLM
from tests.conftest import free_port

BLOCK_SIZE = 4
NUM_BLOCKS = 32
ATOL = 1e-4

CONFIGS = {
    # name: Qwen3Config kwargs
    "tied-mha": {
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "hidden_size": 64,
        "tie_word_embeddings": True,
        "rope_theta": 10000.0,
    },
    "untied-gqa2-headdim": {
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "hidden_size": 64,
        "head_dim": 24,
        "tie_word_embeddings": False,
        "rope_theta": 5000.0,
    },
    "tied-gqa4-odd-vocab": {
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "hidden_size": 48,
        "head_dim": 12,
        "tie_word_embeddings": True,
        "rope_theta": 1e6,
        "vocab_size": 101,
    },
    "untied-mqa": {
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "hidden_size": 32,
        "head_dim": 16,
        "tie_word_embeddings": False,
        "rope_theta": 20000.0,
    },
}


def make_hf_model(model_dir: str, seed: int = 0, **overrides):
    """A random HF Qwen3ForCausalLM saved to model_dir, weights scaled so that logits are O(1)."""
    from transformers import Qwen3Config
    from transformers import Qwen3ForCausalLM as HFQwen3ForCausalLM

    kwargs = {
        "vocab_size": 96,
        "intermediate_size": 80,
        "num_hidden_layers": 2,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 128,
    }
    kwargs.update(overrides)
    torch.manual_seed(seed)
    hf = HFQwen3ForCausalLM(Qwen3Config(**kwargs)).eval()
    with torch.no_grad():
        for param in hf.parameters():
            if param.ndim == 1:  # norms: near 1 but not 1, so a missing norm weight shows
                param.copy_(1 + 0.2 * torch.randn_like(param))
            else:
                param.copy_(torch.randn_like(param) / param.shape[-1] ** 0.5)
    hf.save_pretrained(model_dir, safe_serialization=True)
    return hf


def hf_logits(hf, seq: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([seq])).logits[0]  # (len, vocab)


def build_model(model_dir: str) -> Qwen3ForCausalLM:
    model = Qwen3ForCausalLM(ModelConfig.from_model_dir(str(model_dir)))
    load_model(model, str(model_dir))
    return model.eval()


class PagedCache:
    """A KV cache attached to every Attention layer, with scattered blocks per sequence."""

    def __init__(self, model: Qwen3ForCausalLM, num_seqs: int, seed: int = 0):
        for attn in (m for m in model.modules() if isinstance(m, Attention)):
            shape = (NUM_BLOCKS, BLOCK_SIZE, attn.num_kv_heads, attn.head_dim)
            attn.k_cache, attn.v_cache = torch.zeros(shape), torch.zeros(shape)
        blocks = random.Random(seed).sample(range(NUM_BLOCKS), NUM_BLOCKS)
        per_seq = NUM_BLOCKS // num_seqs
        self.block_tables = [blocks[i * per_seq : (i + 1) * per_seq] for i in range(num_seqs)]
        self.lens = [0] * num_seqs

    def step(self, model: Qwen3ForCausalLM, chunks: list[list[int]], is_prefill: bool):
        """Run the new tokens of each sequence; returns the (num_tokens, vocab) logits."""
        input_ids, positions, slots, cu_q = [], [], [], [0]
        for i, chunk in enumerate(chunks):
            for pos in range(self.lens[i], self.lens[i] + len(chunk)):
                positions.append(pos)
                block = self.block_tables[i][pos // BLOCK_SIZE]
                slots.append(block * BLOCK_SIZE + pos % BLOCK_SIZE)
            input_ids += chunk
            self.lens[i] += len(chunk)
            cu_q.append(len(input_ids))
        cu_k = [0]
        for length in self.lens:
            cu_k.append(cu_k[-1] + length)
        int32 = {"dtype": torch.int32}
        set_context(
            is_prefill=is_prefill,
            cu_seqlens_q=torch.tensor(cu_q, **int32),
            cu_seqlens_k=torch.tensor(cu_k, **int32),
            max_seqlen_q=max(map(len, chunks)),
            max_seqlen_k=max(self.lens),
            slot_mapping=torch.tensor(slots, **int32),
            context_lens=torch.tensor(self.lens, **int32),
            block_tables=torch.tensor(self.block_tables, **int32),
        )
        try:
            with torch.no_grad():
                hidden = model(torch.tensor(input_ids), torch.tensor(positions))
                return model.compute_logits(hidden)
        finally:
            reset_context()


def random_seqs(vocab: int, lengths: list[int], seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(n)] for n in lengths]


def split_rows(logits: torch.Tensor, lengths: list[int]) -> list[torch.Tensor]:
    return list(logits.split(lengths))


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("lengths", [[11], [7, 1, 13]])
def test_prefill_and_decode_match_transformers(tmp_path, name, lengths):
    hf = make_hf_model(tmp_path, **CONFIGS[name])
    model = build_model(tmp_path)
    seqs = random_seqs(hf.config.vocab_size, lengths)
    cache = PagedCache(model, len(seqs))
    logits = cache.step(model, seqs, is_prefill=True)
    for seq, ours in zip(seqs, split_rows(logits, lengths), strict=True):
        torch.testing.assert_close(ours, hf_logits(hf, seq), atol=ATOL, rtol=ATOL)
    # decode: one more token per sequence, attending over the cache the prefill filled
    next_tokens = random_seqs(hf.config.vocab_size, [1] * len(seqs), seed=1)
    logits = cache.step(model, next_tokens, is_prefill=False)
    for row, seq, tok in zip(logits, seqs, next_tokens, strict=True):
        torch.testing.assert_close(row, hf_logits(hf, seq + tok)[-1], atol=ATOL, rtol=ATOL)


def test_chunked_prefill_over_cached_prefix_matches_transformers(tmp_path):
    hf = make_hf_model(tmp_path, **CONFIGS["untied-gqa2-headdim"])
    model = build_model(tmp_path)
    seqs = random_seqs(hf.config.vocab_size, [10, 6])
    cache = PagedCache(model, len(seqs))
    first = cache.step(model, [seqs[0][:5], seqs[1][:3]], is_prefill=True)
    second = cache.step(model, [seqs[0][5:], seqs[1][3:]], is_prefill=True)
    pairs = zip(split_rows(first, [5, 3]), split_rows(second, [5, 3]), strict=True)
    ours = [torch.cat(pair) for pair in pairs]
    for seq, rows in zip(seqs, ours, strict=True):
        torch.testing.assert_close(rows, hf_logits(hf, seq), atol=ATOL, rtol=ATOL)


def test_model_structure_and_cache_shapes(tmp_path):
    make_hf_model(tmp_path, **CONFIGS["tied-gqa4-odd-vocab"])
    model = build_model(tmp_path)
    attns = [m for m in model.modules() if isinstance(m, Attention)]
    assert len(attns) == 2
    assert all((a.num_heads, a.num_kv_heads, a.head_dim) == (8, 2, 12) for a in attns)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    qkv = model.model.layers[0].self_attn.qkv_proj
    assert qkv.weight.shape == ((8 + 2 * 2) * 12, 48)


def test_lm_head_writes_into_out_the_logits_it_returns(tmp_path):
    make_hf_model(tmp_path, **CONFIGS["tied-gqa4-odd-vocab"])
    model = build_model(tmp_path)
    hidden = torch.randn(3, 48)
    out = torch.full((5, model.lm_head.num_embeddings), float("nan"))  # a graph's larger buffer
    with torch.no_grad():
        ref = model.compute_logits(hidden)
        got = model.compute_logits(hidden, out=out[:3])
    assert got.data_ptr() == out.data_ptr() and torch.equal(got, ref)
    assert out[3:].isnan().all()  # rows past the batch untouched


def test_tiny_model_from_shared_matches_transformers(tmp_path):
    from transformers import Qwen3ForCausalLM as HFQwen3ForCausalLM

    from nanoserve.tiny.model import make_tiny_model

    model_dir = make_tiny_model(tmp_path, vocab_size=256, with_tokenizer=False, shards=3)
    hf = HFQwen3ForCausalLM.from_pretrained(model_dir).eval()
    model = build_model(model_dir)
    seq = random_seqs(256, [9])[0]
    logits = PagedCache(model, 1).step(model, [seq], is_prefill=True)
    torch.testing.assert_close(logits, hf_logits(hf, seq), atol=ATOL, rtol=ATOL)


# --- tensor parallelism: 2 CPU ranks over gloo must reproduce the world-size-1 logits ------------

TP_CONFIGS = ["untied-gqa2-headdim", "tied-gqa4-odd-vocab", "untied-mqa"]
TP_LENGTHS = [7, 1, 13]


def run_model(model_dir: str) -> tuple[torch.Tensor, torch.Tensor]:
    model = build_model(model_dir)
    seqs = random_seqs(model.config.vocab_size, TP_LENGTHS)
    cache = PagedCache(model, len(seqs))
    prefill = cache.step(model, seqs, is_prefill=True)
    decode = cache.step(
        model, random_seqs(model.config.vocab_size, [1] * len(seqs), seed=1), is_prefill=False
    )
    return prefill, decode


def _tp_rank_main(rank: int, world_size: int, port: int, model_dirs: list[str], out_dir: str):
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size
    )
    try:
        results = [run_model(d) for d in model_dirs]
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_tensor_parallel_2_ranks_matches_single_process(tmp_path):
    model_dirs = []
    for name in TP_CONFIGS:
        model_dir = tmp_path / name
        make_hf_model(model_dir, **CONFIGS[name])
        model_dirs.append(str(model_dir))
    expected = [run_model(d) for d in model_dirs]
    mp.spawn(_tp_rank_main, args=(2, free_port(), model_dirs, str(tmp_path)), nprocs=2, join=True)
    for rank in range(2):
        results = torch.load(tmp_path / f"rank{rank}.pt")
        for name, ours, ref in zip(TP_CONFIGS, results, expected, strict=True):
            (prefill, decode), (ref_prefill, ref_decode) = ours, ref
            torch.testing.assert_close(prefill, ref_prefill, atol=ATOL, rtol=ATOL, msg=name)
            torch.testing.assert_close(decode, ref_decode, atol=ATOL, rtol=ATOL, msg=name)


def test_bfloat16_model_stays_close_and_keeps_float32_rotary(tmp_path):
    hf = make_hf_model(tmp_path, **CONFIGS["untied-gqa2-headdim"])
    model = build_model(tmp_path).to(torch.bfloat16)
    rotary = model.model.layers[0].self_attn.rotary_emb
    assert rotary.cache_on(torch.device("cpu")).dtype is torch.float32  # model.to() leaves it alone
    seq = random_seqs(hf.config.vocab_size, [12])[0]
    cache = PagedCache(model, 1)
    for attn in (m for m in model.modules() if isinstance(m, Attention)):
        attn.k_cache, attn.v_cache = attn.k_cache.bfloat16(), attn.v_cache.bfloat16()
    logits = cache.step(model, [seq], is_prefill=True)
    assert logits.dtype is torch.bfloat16
    ref = hf_logits(hf, seq)
    assert (logits.float() - ref).abs().max() < 0.05 * ref.abs().max()
    assert (logits.float().argmax(-1) == ref.argmax(-1)).float().mean() > 0.9


def test_fused_all_reduce_slots_alternate_across_layers_and_steps(tmp_path, monkeypatch):
    """Every norm after a row-parallel layer all-reduces its partial sums (fused on CUDA under
    tensor parallelism); two calls in a row on the same slot would let a fast rank overwrite rows a
    peer is still reading, so the slots must alternate through a forward and into the next one."""
    from nanoserve.worker.layers import layernorm

    slots: list[int] = []

    def record(x, residual, weight, eps, slot):
        slots.append(slot)
        # then the unfused path runs, as on one rank

    monkeypatch.setattr(layernorm, "all_reduce_add_rms_norm", record)
    hf = make_hf_model(tmp_path, **CONFIGS["untied-gqa2-headdim"])
    model = build_model(tmp_path)
    seqs = random_seqs(hf.config.vocab_size, [5])
    cache = PagedCache(model, 1)
    logits = cache.step(model, seqs, is_prefill=True)
    assert len(slots) == 2 * hf.config.num_hidden_layers  # post-attention, then the next norm
    cache.step(model, [[1]], is_prefill=False)
    assert len(slots) == 4 * hf.config.num_hidden_layers
    assert all(a != b for a, b in zip(slots, slots[1:])), slots
    torch.testing.assert_close(logits[-1], hf_logits(hf, seqs[0])[-1], atol=ATOL, rtol=ATOL)
