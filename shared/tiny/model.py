"""Writes a tiny random-weight Qwen3 model directory with the real Qwen BPE tokenizer.

It is nanoserve's embedded tiny model (`--model tiny`, what `nanoserve serve` runs with no model
named) and the fixture the tests load; it never imports torch, so weights are made with numpy.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
from pathlib import Path

import numpy as np

from nanoserve.tiny.tokenizer import (
    ADDED_TOKENS,
    ENDOFTEXT_ID,
    IM_END_ID,
    atomic_build,
    cache_root,
    tokenizer_config,
    tokenizer_files_dir,
)

DEFAULT_MODEL_NAME = "tiny-qwen3-v2"  # v2: the real Qwen3 chat template
DEFAULT_SEED = 0

# ---------------------------------------------------------------- weights and config


def _to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), round to nearest even."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounding = ((bits >> 16) & 1) + np.uint32(0x7FFF)
    return ((bits + rounding) >> 16).astype(np.uint16)


def _write_safetensors(path: Path, tensors: dict[str, np.ndarray], dtype: str) -> None:
    """Write the safetensors layout directly (8-byte header length, JSON header, raw data), which
    also covers BF16 that numpy has no dtype for."""
    st_dtype = {"float32": "F32", "bfloat16": "BF16"}[dtype]
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    blobs: list[bytes] = []
    offset = 0
    for name, array in tensors.items():
        data = (_to_bf16_bits(array) if dtype == "bfloat16" else array.astype("<f4")).tobytes()
        header[name] = {
            "dtype": st_dtype,
            "shape": list(array.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        blobs.append(data)
        offset += len(data)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # data section starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        f.writelines(blobs)


def _random_weights(cfg: dict, seed: int) -> dict[str, np.ndarray]:
    """Qwen3ForCausalLM parameter names and shapes, float32; linear weights are (out, in)."""
    rng = np.random.default_rng(seed)
    hidden, head_dim = cfg["hidden_size"], cfg["head_dim"]
    q_dim = cfg["num_attention_heads"] * head_dim
    kv_dim = cfg["num_key_value_heads"] * head_dim
    inter = cfg["intermediate_size"]

    def linear(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float32)

    def norm(size: int) -> np.ndarray:
        # Around 1 but not exactly, so a test that forgets a norm's weight sees a difference.
        return (1.0 + 0.1 * rng.standard_normal(size, dtype=np.float32)).astype(np.float32)

    w: dict[str, np.ndarray] = {"model.embed_tokens.weight": linear(cfg["vocab_size"], hidden)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "self_attn.q_proj.weight"] = linear(q_dim, hidden)
        w[p + "self_attn.k_proj.weight"] = linear(kv_dim, hidden)
        w[p + "self_attn.v_proj.weight"] = linear(kv_dim, hidden)
        w[p + "self_attn.o_proj.weight"] = linear(hidden, q_dim)
        w[p + "self_attn.q_norm.weight"] = norm(head_dim)
        w[p + "self_attn.k_norm.weight"] = norm(head_dim)
        w[p + "input_layernorm.weight"] = norm(hidden)
        w[p + "post_attention_layernorm.weight"] = norm(hidden)
        w[p + "mlp.gate_proj.weight"] = linear(inter, hidden)
        w[p + "mlp.up_proj.weight"] = linear(inter, hidden)
        w[p + "mlp.down_proj.weight"] = linear(hidden, inter)
    w["model.norm.weight"] = norm(hidden)
    if not cfg["tie_word_embeddings"]:
        w["lm_head.weight"] = linear(cfg["vocab_size"], hidden)
    return w


def _write_weights(out: Path, weights: dict[str, np.ndarray], dtype: str, shards: int) -> None:
    if shards == 1:
        _write_safetensors(out / "model.safetensors", weights, dtype)
        return
    itemsize = 2 if dtype == "bfloat16" else 4
    total = sum(a.size for a in weights.values()) * itemsize
    groups: list[dict[str, np.ndarray]] = [{} for _ in range(shards)]
    done, s = 0, 0
    for j, (name, array) in enumerate(weights.items()):
        # Fill shards in order, moving on once a shard holds its share of the bytes or when every
        # later shard needs one of the remaining tensors (no shard is left empty).
        if (
            groups[s]
            and s < shards - 1
            and (done * shards >= (s + 1) * total or len(weights) - j <= shards - 1 - s)
        ):
            s += 1
        groups[s][name] = array
        done += array.size * itemsize
    weight_map: dict[str, str] = {}
    for k, group in enumerate(groups, start=1):
        fname = f"model-{k:05d}-of-{shards:05d}.safetensors"
        _write_safetensors(out / fname, group, dtype)
        weight_map.update(dict.fromkeys(group, fname))
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def make_tiny_model(
    out_dir: str | os.PathLike,
    *,
    vocab_size: int = 151936,
    hidden_size: int = 64,
    intermediate_size: int = 128,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    head_dim: int = 32,
    max_position_embeddings: int = 4096,
    rope_theta: float = 1e6,
    rms_norm_eps: float = 1e-6,
    tie_word_embeddings: bool = True,
    dtype: str = "float32",
    seed: int = DEFAULT_SEED,
    shards: int = 1,
    with_tokenizer: bool = True,
) -> Path:
    """Write a loadable Qwen3ForCausalLM directory with random weights; returns its path."""
    if dtype not in ("float32", "bfloat16"):
        raise ValueError(f"dtype must be 'float32' or 'bfloat16', got {dtype!r}")
    num_tensors = 2 + 11 * num_hidden_layers + (0 if tie_word_embeddings else 1)
    if not 1 <= shards <= num_tensors:
        raise ValueError(
            f"shards must be in [1, {num_tensors}] (one tensor per shard at least), got {shards}"
        )
    if num_attention_heads % num_key_value_heads:
        raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
    if with_tokenizer and vocab_size < ENDOFTEXT_ID + len(ADDED_TOKENS):
        raise ValueError(
            f"vocab_size must be >= {ENDOFTEXT_ID + len(ADDED_TOKENS)} "
            "to hold the Qwen tokenizer, or pass with_tokenizer=False"
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": intermediate_size,
        "num_hidden_layers": num_hidden_layers,
        "num_attention_heads": num_attention_heads,
        "num_key_value_heads": num_key_value_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": max_position_embeddings,
        "rope_theta": rope_theta,
        "rope_scaling": None,
        "rms_norm_eps": rms_norm_eps,
        "tie_word_embeddings": tie_word_embeddings,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": num_hidden_layers,
        "initializer_range": 0.02,
        "use_cache": True,
        "bos_token_id": ENDOFTEXT_ID,
        "eos_token_id": IM_END_ID,
        "torch_dtype": dtype,
        "dtype": dtype,
    }
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    generation_config = {
        "bos_token_id": ENDOFTEXT_ID,
        "eos_token_id": [IM_END_ID, ENDOFTEXT_ID],
        "pad_token_id": ENDOFTEXT_ID,
    }
    (out / "generation_config.json").write_text(json.dumps(generation_config, indent=2) + "\n")
    _write_weights(out, _random_weights(config, seed), dtype, shards)
    if with_tokenizer:
        shutil.copyfile(tokenizer_files_dir() / "tokenizer.json", out / "tokenizer.json")
        tok_config = tokenizer_config(max_position_embeddings)
        (out / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2) + "\n")
    return out


def default_model_dir() -> Path:
    """The embedded default model, built once per machine (same seed, same weights everywhere)."""
    return atomic_build(cache_root() / DEFAULT_MODEL_NAME, make_tiny_model)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="nanoserve make-tiny-model", description="Write a tiny random Qwen3 model directory."
    )
    parser.add_argument(
        "out_dir", nargs="?", help="target dir (default: build the cached default model)"
    )
    parser.add_argument("--vocab-size", type=int, default=151936)
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--intermediate-size", type=int, default=128)
    parser.add_argument("--num-hidden-layers", type=int, default=2)
    parser.add_argument("--num-attention-heads", type=int, default=4)
    parser.add_argument("--num-key-value-heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=32)
    parser.add_argument("--max-position-embeddings", type=int, default=4096)
    parser.add_argument("--rope-theta", type=float, default=1e6)
    parser.add_argument("--untied", action="store_true", help="write a separate lm_head.weight")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--shards", type=int, default=1)
    parser.add_argument("--no-tokenizer", action="store_true")
    args = parser.parse_args(argv)
    if args.out_dir is None:
        print(default_model_dir())
        return
    path = make_tiny_model(
        args.out_dir,
        vocab_size=args.vocab_size,
        hidden_size=args.hidden_size,
        intermediate_size=args.intermediate_size,
        num_hidden_layers=args.num_hidden_layers,
        num_attention_heads=args.num_attention_heads,
        num_key_value_heads=args.num_key_value_heads,
        head_dim=args.head_dim,
        max_position_embeddings=args.max_position_embeddings,
        rope_theta=args.rope_theta,
        tie_word_embeddings=not args.untied,
        dtype=args.dtype,
        seed=args.seed,
        shards=args.shards,
        with_tokenizer=not args.no_tokenizer,
    )
    print(path)


if __name__ == "__main__":
    main()
