"""nanoserve.text.tokenizer (chat template in the jinja2 sandbox, special tokens, off-loop encode) and
frontend.config validation."""

import asyncio
import json
from pathlib import Path

import pytest

from nanoserve.config import parse_config
from nanoserve.errors import InvalidArgument
from nanoserve.frontend.config import FrontendConfig
from nanoserve.text.tokenizer import Tokenizer

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "你好"}]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Tokenizer:
    tok = Tokenizer(tiny_model_dir)
    yield tok
    tok.close()


def _model_dir(path: Path, config: dict) -> Path:
    """A model dir with a small byte-level BPE (loads in milliseconds) and the given config."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(["hello world", "你好 世界"], trainer)
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return path


def test_chat_template_thinking_switch(tokenizer: Tokenizer) -> None:
    on = tokenizer.apply_chat_template(MESSAGES)
    off = tokenizer.apply_chat_template(MESSAGES, enable_thinking=False)
    expected = (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n你好<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert on == expected and off == expected + "<think>\n\n</think>\n\n"
    assert tokenizer.apply_chat_template(
        MESSAGES, add_generation_prompt=False
    ) == expected.removesuffix("<|im_start|>assistant\n")
    ids = tokenizer.encode_chat(MESSAGES)
    assert ids[0] == 151644 and ids.count(151645) == 2  # <|im_start|> ... two <|im_end|>
    assert tokenizer.has_chat_template


def test_special_tokens(tokenizer: Tokenizer) -> None:
    assert {151643, 151644, 151645} <= tokenizer.special_token_ids
    ids = tokenizer.encode("hi<|im_end|>")
    assert ids[-1] == 151645
    assert tokenizer.decode(ids) == "hi"
    assert tokenizer.decode(ids, skip_special_tokens=False) == "hi<|im_end|>"
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.vocab_size >= 151669


def test_encode_runs_off_the_event_loop(tokenizer: Tokenizer) -> None:
    import threading

    seen: list[str] = []
    original = tokenizer._tokenizer

    def spy(texts: list[str], add_special_tokens: bool = True):
        seen.append(threading.current_thread().name)
        return original.encode_batch_fast(texts, add_special_tokens=add_special_tokens)

    async def main() -> tuple[list[int], list[int]]:
        tokenizer._encode_batch = spy  # the GIL-releasing call of `tokenizers`
        try:
            return (
                await tokenizer.encode_async("世界"),
                await tokenizer.encode_chat_async(MESSAGES, enable_thinking=False),
            )
        finally:
            tokenizer._encode_batch = original.encode_batch_fast

    text_ids, chat_ids = asyncio.run(main())
    assert text_ids == tokenizer.encode("世界")
    assert chat_ids == tokenizer.encode_chat(MESSAGES, enable_thinking=False)
    assert seen and all(name.startswith("tokenizer") for name in seen)


def test_sandbox_and_template_errors(tmp_path: Path) -> None:
    template = (
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first must be user') }}"
        "{% endif %}{{ messages | tojson }}{{ ''.__class__.__mro__ }}"
    )
    tok = Tokenizer(_model_dir(tmp_path, {"chat_template": template}))
    with pytest.raises(InvalidArgument, match="messages: .*first must be user"):
        tok.apply_chat_template(MESSAGES)
    with pytest.raises(InvalidArgument, match="messages"):  # the sandbox refuses __class__
        tok.apply_chat_template(MESSAGES[1:])
    tok.close()


def test_named_templates_and_no_template(tmp_path: Path) -> None:
    named = {
        "chat_template": [
            {"name": "tool_use", "template": "T"},
            {"name": "default", "template": "{{ bos_token }}D"},
        ],
        "bos_token": {"content": "<|endoftext|>"},
    }
    tok = Tokenizer(_model_dir(tmp_path / "a", named))
    assert tok.apply_chat_template(MESSAGES) == "<|endoftext|>D"
    bare = Tokenizer(_model_dir(tmp_path / "b", {}))
    assert not bare.has_chat_template
    with pytest.raises(ValueError, match="chat template"):
        bare.apply_chat_template(MESSAGES)
    (tmp_path / "b" / "chat_template.jinja").write_text("J{{ messages | length }}")
    assert Tokenizer(tmp_path / "b").apply_chat_template(MESSAGES) == "J2"
    for t in (tok, bare):
        t.close()


def test_missing_tokenizer_json(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="tokenizer.json"):
        Tokenizer(tmp_path)


def test_frontend_config_flags_and_validation(tiny_model_dir: Path) -> None:
    config = parse_config(
        FrontendConfig,
        [
            "--model",
            str(tiny_model_dir),
            "--port",
            "0",
            "--worker-address",
            "worker:50061",
            "--max-concurrent-requests",
            "8",
            "--no-enable-reflection",
        ],
    )
    assert (config.port, config.worker_address, config.max_concurrent_requests) == (
        0,
        "worker:50061",
        8,
    )
    assert config.model == str(tiny_model_dir) and not config.enable_reflection
    for bad in (
        {"port": 70000},
        {"worker_address": "nohost"},
        {"max_concurrent_requests": 0},
        {"request_timeout_s": float("nan")},
        {"worker_connect_timeout_s": 0},
        {"log_level": "LOUD"},
        {"max_message_bytes": 10},
    ):
        with pytest.raises(ValueError, match=next(iter(bad))):
            FrontendConfig(model="tiny", **bad)
