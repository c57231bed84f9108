"""ModelConfig.from_model_dir: transformers 4 and 5 config layouts, eos ids, validation errors."""

import json

import pytest

from nanoserve.worker.model.config import ModelConfig

BASE = {
    "architectures": ["Qwen3ForCausalLM"],
    "vocab_size": 1000,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "bfloat16",
    "eos_token_id": 7,
}


def write_dir(tmp_path, config: dict, generation: dict | None = None):
    (tmp_path / "config.json").write_text(json.dumps(config))
    if generation is not None:
        (tmp_path / "generation_config.json").write_text(json.dumps(generation))
    return str(tmp_path)


def test_transformers4_layout_and_defaults(tmp_path):
    config = ModelConfig.from_model_dir(
        write_dir(tmp_path, {**BASE, "rope_theta": 1e6, "rope_scaling": None})
    )
    assert config.head_dim == 16  # hidden_size / num_attention_heads
    assert config.rope_theta == 1e6
    assert config.rms_norm_eps == 1e-5
    assert config.tie_word_embeddings is False
    assert config.dtype == "bfloat16"
    assert config.eos_token_ids == (7,)


def test_transformers5_rope_parameters(tmp_path):
    from transformers import Qwen3Config

    Qwen3Config(
        vocab_size=100,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=24,
        rope_theta=5000.0,
        tie_word_embeddings=True,
        eos_token_id=3,
    ).save_pretrained(tmp_path)
    # a bare Qwen3Config has no architectures: model_type "qwen3" identifies it
    assert "rope_parameters" in json.loads((tmp_path / "config.json").read_text())
    config = ModelConfig.from_model_dir(str(tmp_path))
    assert (config.rope_theta, config.head_dim, config.num_key_value_heads) == (5000.0, 24, 1)
    assert config.tie_word_embeddings is True
    assert config.eos_token_ids == (3,)


def test_generation_config_eos_list_wins(tmp_path):
    config = ModelConfig.from_model_dir(
        write_dir(tmp_path, BASE, {"eos_token_id": [5, 7], "bos_token_id": 1})
    )
    assert config.eos_token_ids == (5, 7)
    assert config.bos_token_id == 1


def test_shared_tiny_model_reads(tmp_path):
    from nanoserve.tiny.model import make_tiny_model

    config = ModelConfig.from_model_dir(
        str(make_tiny_model(tmp_path, vocab_size=256, with_tokenizer=False))
    )
    assert (config.vocab_size, config.head_dim, config.rope_theta) == (256, 32, 1e6)
    assert len(config.eos_token_ids) == 2


@pytest.mark.parametrize(
    "change, message",
    [
        ({"architectures": ["LlamaForCausalLM"]}, r"not a Qwen3 model: architectures=\['LlamaFor"),
        ({"architectures": None, "model_type": "llama"}, r"not a Qwen3 model: architectures=\[\]"),
        ({"num_key_value_heads": 3}, "divisible by num_key_value_heads"),
        ({"hidden_size": 0}, "hidden_size must be a positive integer"),
        ({"head_dim": 15}, "head_dim must be even"),
        ({"torch_dtype": "int8"}, "dtype must be one of"),
        (
            {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
            "unsupported rope scaling type 'yarn",
        ),
        ({"rope_parameters": {"rope_type": "linear", "rope_theta": 1.0}}, "'linear'"),
        ({"hidden_act": "gelu"}, "unsupported hidden_act"),
        ({"vocab_size": None}, "vocab_size must be a positive integer"),
    ],
)
def test_invalid_configs_raise(tmp_path, change, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_model_dir(write_dir(tmp_path, {**BASE, **change}))


def test_missing_field_and_files(tmp_path):
    with pytest.raises(ValueError, match="missing field 'intermediate_size'"):
        ModelConfig.from_model_dir(
            write_dir(tmp_path, {k: v for k, v in BASE.items() if k != "intermediate_size"})
        )
    with pytest.raises(ValueError, match="model directory not found"):
        ModelConfig.from_model_dir(str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no config.json"):
        ModelConfig.from_model_dir(str(tmp_path / "empty"))


def test_generation_config_sampling_defaults(tmp_path):
    qwen3 = {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "do_sample": True, "eos_token_id": 7}
    config = ModelConfig.from_model_dir(write_dir(tmp_path, BASE, qwen3))
    assert dict(config.sampling_defaults) == {"temperature": 0.6, "top_p": 0.95, "top_k": 20}
    with pytest.raises(ValueError, match="generation_config.json: top_p must be in"):
        ModelConfig.from_model_dir(write_dir(tmp_path, BASE, {"top_p": 0}))
    with pytest.raises(ValueError, match="generation_config.json: temperature must be a number"):
        ModelConfig.from_model_dir(write_dir(tmp_path, BASE, {"temperature": "hot"}))
