"""nanoserve.worker.model.loader.load_model: sharded checkpoints, dtype casting, clear errors naming the tensor."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from nanoserve.tiny.model import make_tiny_model
from nanoserve.worker.model.config import ModelConfig
from nanoserve.worker.model.loader import load_model
from nanoserve.worker.model.qwen3 import Qwen3ForCausalLM

SMALL = {
    "vocab_size": 200,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "with_tokenizer": False,
}


def new_model(model_dir) -> Qwen3ForCausalLM:
    return Qwen3ForCausalLM(ModelConfig.from_model_dir(str(model_dir)))


def loaded(model_dir) -> Qwen3ForCausalLM:
    model = new_model(model_dir)
    load_model(model, str(model_dir))
    return model


def expected_params(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    # checkpoint tensors packed the way the model stores them
    out = dict(tensors)
    for i in range(2):
        attn, mlp = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        out[attn + "qkv_proj.weight"] = torch.cat(
            [out.pop(attn + p + ".weight") for p in ("q_proj", "k_proj", "v_proj")]
        )
        out[mlp + "gate_up_proj.weight"] = torch.cat(
            [out.pop(mlp + p + ".weight") for p in ("gate_proj", "up_proj")]
        )
    return out


@pytest.mark.parametrize("tie", [True, False])
def test_single_file_fills_every_parameter(tmp_path, tie):
    model_dir = make_tiny_model(tmp_path, tie_word_embeddings=tie, **SMALL)
    model = loaded(model_dir)
    expected = expected_params(load_file(model_dir / "model.safetensors"))
    params = dict(model.named_parameters())
    assert sorted(params) == sorted(expected)
    for name, tensor in expected.items():
        torch.testing.assert_close(params[name].data, tensor, atol=0, rtol=0, msg=name)
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tie


def test_sharded_checkpoint_equals_single_file(tmp_path):
    single = loaded(make_tiny_model(tmp_path / "one", **SMALL))
    sharded_dir = make_tiny_model(tmp_path / "many", shards=4, **SMALL)
    assert (sharded_dir / "model.safetensors.index.json").exists()
    sharded = loaded(sharded_dir)
    pairs = zip(single.named_parameters(), sharded.named_parameters(), strict=True)
    for (name, a), (_, b) in pairs:
        assert torch.equal(a, b), name


def test_bf16_checkpoint_loads_into_float32_model(tmp_path):
    model_dir = make_tiny_model(tmp_path, dtype="bfloat16", **SMALL)
    assert ModelConfig.from_model_dir(str(model_dir)).dtype == "bfloat16"
    model = loaded(model_dir)
    ckpt = load_file(model_dir / "model.safetensors")
    assert ckpt["model.norm.weight"].dtype is torch.bfloat16
    assert model.model.norm.weight.dtype is torch.float32
    torch.testing.assert_close(
        model.model.norm.weight.data, ckpt["model.norm.weight"].float(), atol=0, rtol=0
    )


def rewrite(model_dir, edit) -> None:
    path = model_dir / "model.safetensors"
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path)


def test_missing_tensor_is_named(tmp_path):
    model_dir = make_tiny_model(tmp_path, **SMALL)
    rewrite(model_dir, lambda t: t.pop("model.layers.1.self_attn.k_proj.weight"))
    with pytest.raises(ValueError, match=r"missing 1 tensor\(s\): model.layers.1.self_attn.k_proj"):
        load_model(new_model(model_dir), str(model_dir))


def test_untied_model_without_lm_head_is_an_error(tmp_path):
    model_dir = make_tiny_model(tmp_path, tie_word_embeddings=False, **SMALL)
    rewrite(model_dir, lambda t: t.pop("lm_head.weight"))
    with pytest.raises(ValueError, match="lm_head.weight"):
        load_model(new_model(model_dir), str(model_dir))


def test_unexpected_tensor_is_named(tmp_path):
    model_dir = make_tiny_model(tmp_path, **SMALL)
    rewrite(model_dir, lambda t: t.update({"model.layers.0.mlp.extra.weight": torch.zeros(2)}))
    with pytest.raises(ValueError, match="unexpected tensor 'model.layers.0.mlp.extra.weight'"):
        load_model(new_model(model_dir), str(model_dir))


@pytest.mark.parametrize(
    "name",
    [
        "model.layers.0.self_attn.v_proj.weight",
        "model.layers.0.mlp.down_proj.weight",
        "model.embed_tokens.weight",
        "model.norm.weight",
    ],
)
def test_shape_mismatch_is_named(tmp_path, name):
    model_dir = make_tiny_model(tmp_path, **SMALL)
    rewrite(
        model_dir, lambda t: t.update({name: torch.zeros(t[name].shape[0] + 2, *t[name].shape[1:])})
    )
    with pytest.raises(ValueError, match=f"tensor '{name}'.*shape mismatch"):
        load_model(new_model(model_dir), str(model_dir))


def test_no_weights_and_broken_index(tmp_path):
    model_dir = make_tiny_model(tmp_path, shards=2, **SMALL)
    index = json.loads((model_dir / "model.safetensors.index.json").read_text())
    (model_dir / sorted(set(index["weight_map"].values()))[1]).unlink()
    with pytest.raises(ValueError, match="names a missing file"):
        load_model(new_model(model_dir), str(model_dir))
    (model_dir / "model.safetensors.index.json").unlink()
    for f in model_dir.glob("*.safetensors"):
        f.unlink()
    with pytest.raises(ValueError, match=r"no \*.safetensors files"):
        load_model(new_model(model_dir), str(model_dir))


def test_progress_bar_counts_tensors_only_when_asked(tmp_path, capsys):
    model_dir = make_tiny_model(tmp_path, shards=3, **SMALL)
    num_tensors = sum(len(load_file(p)) for p in model_dir.glob("*.safetensors"))
    load_model(new_model(model_dir), str(model_dir), progress=True)
    err = capsys.readouterr().err
    assert "Loading weights" in err and f"{num_tensors}/{num_tensors}" in err
    load_model(new_model(model_dir), str(model_dir), progress=None)  # stderr is no terminal here
    load_model(new_model(model_dir), str(model_dir))
    assert capsys.readouterr().err == ""
