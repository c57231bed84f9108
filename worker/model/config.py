"""The model's shape and ids, read with json only from a Hugging Face Qwen3 directory (config.json,
generation_config.json). ModelRunner builds Qwen3ForCausalLM from it; the worker reports
eos_token_ids and max_position_embeddings to the frontend; LLMEngine fills the unset sampling fields
of each request from sampling_defaults (vLLM).
"""

import json
import os
from dataclasses import dataclass

from nanoserve.sampling import FALLBACKS, range_violation

_DTYPES = ("float32", "float16", "bfloat16")
_ARCHITECTURE = "Qwen3ForCausalLM"


@dataclass(frozen=True, slots=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 32768
    tie_word_embeddings: bool = False
    dtype: str = "float32"  # the checkpoint's dtype; the engine may run in another
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    # generation_config.json's sampling fields (Qwen3: temperature 0.6, top_p 0.95, top_k 20)
    sampling_defaults: tuple[tuple[str, float], ...] = ()

    def __post_init__(self):
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "max_position_embeddings",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be divisible "
                f"by num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
        if not self.rms_norm_eps > 0:
            raise ValueError(f"rms_norm_eps must be positive, got {self.rms_norm_eps!r}")
        if not self.rope_theta > 0:
            raise ValueError(f"rope_theta must be positive, got {self.rope_theta!r}")
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {self.dtype!r}")
        # an id past vocab_size is allowed (transformers only warns): it is simply never sampled
        for token_id in (*self.eos_token_ids, self.bos_token_id):
            if token_id is not None and (not isinstance(token_id, int) or token_id < 0):
                raise ValueError(
                    f"token ids must be non-negative integers, got eos_token_ids="
                    f"{self.eos_token_ids!r}, bos_token_id={self.bos_token_id!r}"
                )

    def max_len(self, requested: int) -> int:
        """`--max-model-len` (0: not set) capped by the positions the model was trained for; the
        engine lowers it further to what the KV cache holds."""
        return min(requested or self.max_position_embeddings, self.max_position_embeddings)

    @classmethod
    def from_model_dir(cls, path: str) -> "ModelConfig":
        if not os.path.isdir(path):
            raise ValueError(f"model directory not found: {path}")
        config_path = os.path.join(path, "config.json")
        if not os.path.isfile(config_path):
            raise ValueError(f"no config.json in model directory {path}")
        with open(config_path) as f:
            hf = json.load(f)
        architectures = hf.get("architectures") or []
        # a bare config (Qwen3Config().save_pretrained) has no architectures, only model_type
        bare_qwen3 = not architectures and hf.get("model_type") == "qwen3"
        if _ARCHITECTURE not in architectures and not bare_qwen3:
            raise ValueError(f"not a Qwen3 model: architectures={architectures}")
        _check_supported(hf)
        generation = {}
        generation_path = os.path.join(path, "generation_config.json")
        if os.path.isfile(generation_path):
            with open(generation_path) as f:
                generation = json.load(f)

        def required(name: str):
            if name not in hf:
                raise ValueError(f"config.json: missing field {name!r}")
            return hf[name]

        hidden_size, num_heads = required("hidden_size"), required("num_attention_heads")
        eos = generation.get("eos_token_id", hf.get("eos_token_id"))
        return cls(
            vocab_size=required("vocab_size"),
            hidden_size=hidden_size,
            intermediate_size=required("intermediate_size"),
            num_hidden_layers=required("num_hidden_layers"),
            num_attention_heads=num_heads,
            num_key_value_heads=hf.get("num_key_value_heads") or num_heads,
            head_dim=hf.get("head_dim") or hidden_size // num_heads,
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            rope_theta=float(_rope_theta(hf)),
            max_position_embeddings=hf.get("max_position_embeddings", 32768),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            dtype=hf.get("dtype") or hf.get("torch_dtype") or "float32",
            eos_token_ids=_id_tuple(eos),
            bos_token_id=generation.get("bos_token_id", hf.get("bos_token_id")),
            sampling_defaults=sampling_defaults(generation),
        )


def sampling_defaults(generation: dict) -> tuple[tuple[str, float], ...]:
    """The sampling fields of a generation_config.json (those SamplingParams may leave unset),
    checked by the same rules as a request's."""
    found = {name: generation[name] for name in FALLBACKS if generation.get(name) is not None}
    for name, value in found.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"generation_config.json: {name} must be a number, got {value!r}")
    for name, value in found.items():
        rule = range_violation(name, value)
        if rule is not None:
            raise ValueError(f"generation_config.json: {name} must be {rule}, got {value!r}")
    return tuple(sorted(found.items()))


def _rope_theta(hf: dict) -> float:
    # transformers 5 writes {"rope_parameters": {"rope_theta": ..., "rope_type": "default"}};
    # transformers 4 writes "rope_theta" at the top level and an optional "rope_scaling" dict.
    params = hf.get("rope_parameters") or {}
    return params.get("rope_theta", hf.get("rope_theta", 10000.0))


def _check_supported(hf: dict) -> None:
    for key in ("rope_parameters", "rope_scaling"):
        rope = hf.get(key) or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise ValueError(
                f"unsupported rope scaling type {rope_type!r} in config.json "
                f"({key}); only the default rotary embedding is implemented"
            )
    if hf.get("hidden_act", "silu") != "silu":
        raise ValueError(f"unsupported hidden_act {hf['hidden_act']!r}; Qwen3 uses 'silu'")
    if hf.get("attention_bias", False):
        raise ValueError("unsupported attention_bias=true; Qwen3 projections have no bias")
    if hf.get("use_sliding_window", False):
        raise ValueError("unsupported use_sliding_window=true; only full attention is implemented")


def _id_tuple(value) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(value) if isinstance(value, list) else (value,)
