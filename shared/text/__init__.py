"""Text and token ids for both sides: the model's tokenizer.json and chat template (the frontend's, and
the offline LLM's for text prompts), with special-token text kept as text."""

from pathlib import Path
from typing import Any


def load_prompt_tokenizer(model_dir: str | Path) -> Any:
    """The Tokenizer of `model_dir` for the offline LLM's text prompts (imported only then: the
    worker service sees token ids only); ValueError, naming the fix, when
    the directory has no tokenizer.json or the tokenizer libraries are not installed."""
    if not (Path(model_dir) / "tokenizer.json").is_file():
        raise ValueError(
            f"prompts: text prompts need a tokenizer.json in {model_dir}; pass token ids "
            "(list[int]) instead"
        )
    try:
        from nanoserve.text.tokenizer import Tokenizer
    except ImportError as e:
        raise ValueError(
            f"prompts: text prompts need the tokenizer libraries ({e}): "
            "pip install 'nanoserve[frontend]', or pass token ids (list[int])"
        ) from None
    return Tokenizer(model_dir, num_threads=1)
