"""Unit-test fixtures used by several modules: the frontend's Tokenizer over the tiny model."""

from pathlib import Path

import pytest

from nanoserve.text.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Tokenizer:
    tok = Tokenizer(tiny_model_dir)
    yield tok
    tok.close()
