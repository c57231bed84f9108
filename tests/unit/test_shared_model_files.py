"""nanoserve.model_files and shared.log: pure-python helpers."""

import hashlib
import logging
from pathlib import Path

import pytest

from nanoserve.log import setup_logging
from nanoserve.model_files import read_json, tokenizer_digest


def test_tokenizer_digest(tmp_path: Path) -> None:
    assert tokenizer_digest(tmp_path) == hashlib.sha256(b"").hexdigest()
    (tmp_path / "tokenizer.json").write_bytes(b'{"a": 1}')
    assert tokenizer_digest(tmp_path) == hashlib.sha256(b'{"a": 1}').hexdigest()
    (tmp_path / "tokenizer_config.json").write_bytes(b'{"b": 2}')
    both = tokenizer_digest(tmp_path)
    assert both == hashlib.sha256(b'{"a": 1}{"b": 2}').hexdigest()
    (tmp_path / "config.json").write_text("{}")  # other files do not count
    assert tokenizer_digest(str(tmp_path)) == both
    (tmp_path / "tokenizer_config.json").write_bytes(b'{"b": 3}')
    assert tokenizer_digest(tmp_path) != both


def test_read_json(tmp_path: Path) -> None:
    (tmp_path / "ok.json").write_text('{"eos_token_id": [1, 2]}')
    assert read_json(tmp_path / "ok.json") == {"eos_token_id": [1, 2]}
    (tmp_path / "list.json").write_text("[1]")
    (tmp_path / "broken.json").write_text("{")
    for name in ("missing.json", "list.json", "broken.json"):
        with pytest.raises(ValueError, match=name):
            read_json(tmp_path / name)


def test_setup_logging(capsys) -> None:
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    try:
        setup_logging("worker", "debug", rank=0)
        logging.getLogger("nanoserve.worker.service.server").info("worker listening on 127.0.0.1:5")
        assert (
            "INFO [worker:r0] nanoserve.worker.service.server: worker listening on 127.0.0.1:5"
            in capsys.readouterr().out
        )
        setup_logging("worker", "DEBUG", rank=1)
        assert root.level == logging.WARNING
        setup_logging("frontend", "INFO")
        logging.getLogger("x").warning("w")
        assert "[frontend] x: w" in capsys.readouterr().out
        with pytest.raises(ValueError, match="log_level"):
            setup_logging("frontend", "LOUD")
    finally:
        root.handlers[:], root.level = saved
