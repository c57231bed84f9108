"""The public Qwen3 shapes the benchmarks run with random weights (load_format=dummy), and the
H200 speed of light of the throughput workload; imported by every benchmark."""

import json
from pathlib import Path

SHAPES = {  # config.json fields of the public Qwen3 checkpoints
    "qwen3-0.6b": dict(
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        tie_word_embeddings=True,
    ),
    "qwen3-8b": dict(
        hidden_size=4096,
        intermediate_size=12288,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        tie_word_embeddings=False,
    ),
    "qwen3-32b": dict(
        hidden_size=5120,
        intermediate_size=25600,
        num_hidden_layers=64,
        num_attention_heads=64,
        num_key_value_heads=8,
        tie_word_embeddings=False,
    ),
}
# output tokens/s at the H200 speed of light for the throughput workload
# (../shared/research/perf_anchors.md §5: measured 4.3 TB/s and 790 TFLOP/s)
H200_SPEED_OF_LIGHT = {"qwen3-0.6b": 36_000}


def write_shape_dir(shape: str, out: Path) -> Path:
    """A model directory with config.json only (weights come from load_format=dummy)."""
    cfg = dict(
        architectures=["Qwen3ForCausalLM"],
        model_type="qwen3",
        vocab_size=151936,
        head_dim=128,
        max_position_embeddings=40960,
        rms_norm_eps=1e-6,
        rope_theta=1e6,
        hidden_act="silu",
        attention_bias=False,
        torch_dtype="bfloat16",
        bos_token_id=151643,
        eos_token_id=151645,
        **SHAPES[shape],
    )
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    return out
