"""Tiny random Qwen3 checkpoints made by transformers, and its greedy tokens as the reference."""

import random
from pathlib import Path

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

EOS = 1


def make_hf_model(path: Path, seed: int = 0, **overrides) -> Qwen3ForCausalLM:
    """Write a random tiny Qwen3 checkpoint to `path` and return the transformers model."""
    kw = dict(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        eos_token_id=EOS,
        bos_token_id=0,
        rope_theta=10000.0,
    )
    kw.update(overrides)
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(Qwen3Config(**kw)).eval()
    # make the norms non-trivial so that a missing or misplaced norm shows
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(path, safe_serialization=True)
    return model


def hf_greedy(
    model: Qwen3ForCausalLM, prompts: list[list[int]], max_new_tokens: int
) -> list[list[int]]:
    out = []
    with torch.no_grad():
        for p in prompts:
            ids = model.generate(
                torch.tensor([p]),
                max_new_tokens=max_new_tokens,
                min_new_tokens=max_new_tokens,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
            )
            out.append(ids[0, len(p) :].tolist())
    return out


def prompts_of(lengths: list[int], seed: int = 0) -> list[list[int]]:
    """Random prompts of these lengths over the tiny checkpoints' vocabulary (ids 2..511)."""
    rng = random.Random(seed)
    return [[rng.randrange(2, 512) for _ in range(n)] for n in lengths]
