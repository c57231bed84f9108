"""Text for the offline API: nanoserve.worker.LLM encodes string prompts and decodes completions with
the model directory's tokenizer.json through this module, imported only when a prompt is a string
(the worker service itself sees token ids only and never loads a tokenizer).
"""

from pathlib import Path
from typing import Any


def load_prompt_tokenizer(model_dir: str | Path) -> Any:
    """The frontend's Tokenizer for `model_dir` (encode/decode); ValueError, naming the fix, when
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
