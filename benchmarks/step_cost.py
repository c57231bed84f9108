"""Bytes and FLOPs of one engine step on a Qwen3 shape (weights, KV reads and writes, attention,
LM head), against the H200's measured bounds; used by the roofline account and its kernel profile."""

from dataclasses import dataclass

from nanoserve.benchmarks.shapes import SHAPES

HBM_BYTES_S = 4.3e12  # measured copy bandwidth (../shared/research/perf_anchors.md §5)
PEAK_FLOP_S = 790e12  # measured dense bf16
BF16 = 2
VOCAB = 151936  # every Qwen3 checkpoint's (benchmarks.engine.write_shape_dir)


@dataclass(frozen=True, slots=True)
class Shape:
    hidden: int
    inter: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int = 128
    vocab: int = VOCAB

    @classmethod
    def named(cls, name: str) -> "Shape":
        s = SHAPES[name]
        return cls(
            s["hidden_size"],
            s["intermediate_size"],
            s["num_hidden_layers"],
            s["num_attention_heads"],
            s["num_key_value_heads"],
        )

    @property
    def linear_params(self) -> int:
        """qkv, o, gate_up, down of all layers."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return self.layers * (
            self.hidden * (q + 2 * kv) + q * self.hidden + 3 * self.hidden * self.inter
        )

    @property
    def lm_head_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * BF16

    @property
    def act_bytes_per_token(self) -> int:
        """Activations a token's forward reads and writes outside the GEMM weights and the KV cache,
        per pass over all layers: residual + norms (4 hidden-wide reads/writes, twice a layer),
        q/k/v in and out of rotary, attention output, gate_up out, SiLU in/out, down in."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        per_layer = 8 * self.hidden + 2 * (q + 2 * kv) + 2 * q + 2 * self.inter + 3 * self.inter
        return self.layers * per_layer * BF16


@dataclass(frozen=True, slots=True)
class Cost:
    bytes: float
    flops: float

    def __add__(self, other: "Cost") -> "Cost":
        return Cost(self.bytes + other.bytes, self.flops + other.flops)

    @property
    def bound_s(self) -> float:
        """The step's time at the roofline: moved at full bandwidth or computed at peak."""
        return max(self.bytes / HBM_BYTES_S, self.flops / PEAK_FLOP_S)


def step_cost(shape: Shape, items: list[tuple[int, int]], sampled: int | None = None) -> Cost:
    """One forward over sequences given as (tokens already in the KV cache, tokens computed now):
    weights read once, KV of every attended token read once (GQA: once per KV head), new KV written,
    logits (fp32) written and read for the `sampled` sequences (default: all)."""
    n = sum(new for _, new in items)
    s = len(items) if sampled is None else sampled
    kv_read = sum(past + new for past, new in items) * shape.kv_bytes_per_token
    weights = (shape.linear_params + shape.lm_head_params) * BF16
    moved = (
        weights
        + kv_read
        + n * shape.kv_bytes_per_token
        + n * shape.act_bytes_per_token
        + 2 * s * shape.vocab * 4
    )
    # attention: QK^T and PV, 2 FLOPs a multiply-add, causal within the new tokens
    attn = sum(
        4 * shape.heads * shape.head_dim * shape.layers * new * (past + (new + 1) / 2)
        for past, new in items
    )
    return Cost(moved, 2 * n * shape.linear_params + 2 * s * shape.lm_head_params + attn)
