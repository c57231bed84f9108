"""Fill a model's parameters from a Hugging Face safetensors checkpoint (one file, or shards
listed in model.safetensors.index.json). Each parameter's weight_loader reads, through a lazy
safetensors slice, only the shard its tensor-parallel rank keeps; the dtype is cast on copy.
A tqdm bar on stderr counts the tensors (by default only when stderr is a terminal: logs stay clean).
"""

import glob
import json
import os

from safetensors import safe_open
from torch import nn
from tqdm import tqdm

from nanoserve.worker.layers.linear import load_whole

_INDEX = "model.safetensors.index.json"
# tensors some checkpoints carry that the model recomputes
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def checkpoint_files(model_dir: str) -> list[str]:
    index_path = os.path.join(model_dir, _INDEX)
    if os.path.isfile(index_path):
        with open(index_path) as f:
            weight_map = json.load(f)["weight_map"]
        files = [os.path.join(model_dir, name) for name in sorted(set(weight_map.values()))]
        for path in files:
            if not os.path.isfile(path):
                raise ValueError(f"{_INDEX} names a missing file: {path}")
        return files
    files = sorted(glob.glob(os.path.join(model_dir, "*.safetensors")))
    if not files:
        raise ValueError(f"no *.safetensors files in model directory {model_dir}")
    return files


def _target(name: str, mapping: dict) -> tuple[str, object]:
    # model.layers.0.self_attn.q_proj.weight -> (model.layers.0.self_attn.qkv_proj.weight, "q")
    for ckpt_name, (param_name, shard_id) in mapping.items():
        if f".{ckpt_name}." in name:
            return name.replace(f".{ckpt_name}.", f".{param_name}."), shard_id
    return name, None


def load_model(model: nn.Module, model_dir: str, progress: bool | None = False) -> None:
    """progress: a bar on stderr (None: only when stderr is a terminal)."""
    mapping = getattr(model, "packed_modules_mapping", {})
    tied = getattr(getattr(model, "config", None), "tie_word_embeddings", False)
    params = dict(model.named_parameters())  # a tied lm_head.weight appears once, as embed_tokens
    needed = _needed(model, mapping)
    loaded: set[tuple[str, object]] = set()
    files = checkpoint_files(model_dir)
    bar = tqdm(
        total=0 if progress is False else _num_tensors(files),
        unit="tensor",
        desc="Loading weights",
        disable=None if progress is None else not progress,
    )
    with bar:
        for path in files:
            _load_file(path, params, mapping, tied, loaded, bar)
    missing = sorted(ckpt_name for key, ckpt_name in needed.items() if key not in loaded)
    if missing:
        raise ValueError(
            f"checkpoint in {model_dir} is missing {len(missing)} tensor(s): "
            + ", ".join(missing[:8])
            + (" ..." if len(missing) > 8 else "")
        )


def _num_tensors(files: list[str]) -> int:
    total = 0
    for path in files:  # reads the headers only
        with safe_open(path, framework="pt") as f:
            total += len(f.keys())
    return total


def _load_file(
    path: str, params: dict, mapping: dict, tied: bool, loaded: set[tuple[str, object]], bar: tqdm
) -> None:
    with safe_open(path, framework="pt") as f:
        for name in f.keys():  # noqa: SIM118 (safe_open is not iterable)
            if name.endswith(_IGNORED_SUFFIXES) or (tied and name == "lm_head.weight"):
                bar.update()
                continue
            param_name, shard_id = _target(name, mapping)
            param = params.get(param_name)
            if param is None:
                raise ValueError(
                    f"unexpected tensor {name!r} in {os.path.basename(path)}: "
                    f"the model has no parameter {param_name!r}"
                )
            weight_loader = getattr(param, "weight_loader", load_whole)
            try:
                if shard_id is None:
                    weight_loader(param, f.get_slice(name))
                else:
                    weight_loader(param, f.get_slice(name), shard_id)
            except ValueError as e:
                raise ValueError(f"tensor {name!r} in {os.path.basename(path)}: {e}") from None
            loaded.add((param_name, shard_id))
            bar.update()


def _needed(model: nn.Module, mapping: dict) -> dict[tuple[str, object], str]:
    # (parameter, shard_id) that a complete checkpoint fills -> the checkpoint tensor's name
    needed: dict[tuple[str, object], str] = {}
    for name, _ in model.named_parameters():
        shards = {
            shard_id: name.replace(f".{param_name}.", f".{ckpt_name}.")
            for ckpt_name, (param_name, shard_id) in mapping.items()
            if f".{param_name}." in name
        }
        needed.update({(name, k): v for k, v in shards.items()} if shards else {(name, None): name})
    return needed
