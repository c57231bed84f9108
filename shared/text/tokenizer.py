"""The frontend's tokenizer: tokenizer.json through `tokenizers`, and the chat template from
tokenizer_config.json rendered in a jinja2 sandbox. Encoding runs in a thread pool, off the loop,
and without the GIL, so a 4 MB prompt does not stall the event loop (health checks, other streams).
"""

import asyncio
import functools
import json
import logging
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as HFTokenizer

from nanoserve.errors import InvalidArgument
from nanoserve.model_files import read_json
from nanoserve.text.special_text import encode_escaped, holds_special_text
from nanoserve.text.text_stream import ByteText, TextStream, WindowText, byte_tables

logger = logging.getLogger(__name__)


def _token_content(token: Any) -> str | None:
    """tokenizer_config.json spells special tokens as a string or as {"content": ...}."""
    if isinstance(token, dict):
        return token.get("content")
    return token if isinstance(token, str) else None


def _load_chat_template(model_dir: Path, config: dict[str, Any]) -> str | None:
    # Newer Hugging Face exports keep the template in its own file.
    standalone = model_dir / "chat_template.jinja"
    if standalone.is_file():
        return standalone.read_text(encoding="utf-8")
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None


# Texts of at least this many characters are encoded one at a time (see Tokenizer._run_encode).
LARGE_ENCODE_CHARS = 256 * 1024


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(value: Any, indent: int | None = None) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent)


class Tokenizer:
    """Encodes prompts, renders chat templates and decodes token ids for one model directory."""

    def __init__(
        self, model_dir: str | Path, num_threads: int = 4, special_text_in_messages: bool = False
    ) -> None:
        """`special_text_in_messages`: special-token text in the caller's messages becomes the
        special tokens (vLLM's behaviour); off, it stays text (text.special_text)."""
        model_dir = Path(model_dir)
        path = model_dir / "tokenizer.json"
        if not path.is_file():
            raise ValueError(f"model: {model_dir} has no tokenizer.json")
        self._tokenizer = HFTokenizer.from_file(str(path))
        config_path = model_dir / "tokenizer_config.json"
        config = read_json(config_path) if config_path.is_file() else {}
        self.bos_token = _token_content(config.get("bos_token"))
        self.eos_token = _token_content(config.get("eos_token"))
        # Ids decode() drops with skip_special_tokens (e.g. <|im_end|>), as tokenizer.json marks.
        self.special_token_ids = frozenset(
            i for i, token in self._tokenizer.get_added_tokens_decoder().items() if token.special
        )
        self.vocab_size = self._tokenizer.get_vocab_size(with_added_tokens=True)
        self.special_texts = tuple(
            t.content for t in self._tokenizer.get_added_tokens_decoder().values() if t.special
        )
        self._special_text_in_messages = special_text_in_messages
        self._text_only: HFTokenizer | None = None  # a copy that parses no special token
        # (special tokens kept, skipped): each id's bytes, for a byte-level BPE tokenizer
        self._byte_tables = byte_tables(self._tokenizer)
        self._encode_batch = getattr(  # encode_batch_fast: tokenizers >= 0.21
            self._tokenizer, "encode_batch_fast", self._tokenizer.encode_batch
        )
        self.chat_template = _load_chat_template(model_dir, config)
        self._template: jinja2.Template | None = None
        if self.chat_template is not None:
            env = ImmutableSandboxedEnvironment(
                trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
            )
            env.filters["tojson"] = _tojson
            env.globals["raise_exception"] = _raise_exception
            env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
            self._template = env.from_string(self.chat_template)
        self._executor = ThreadPoolExecutor(num_threads, thread_name_prefix="tokenizer")
        self._large_encode: asyncio.Semaphore | None = None

    @property
    def has_chat_template(self) -> bool:
        return self._template is not None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        # `tokenizers` releases the GIL in encode_batch but holds it for all of encode: a 4 MB
        # prompt would otherwise freeze every other thread, the event loop included, for seconds.
        # encode_batch_fast computes no character offsets: 2-3x faster, and dropping the result
        # (under the GIL) is cheap.
        return self._encode_batch([text], add_special_tokens=add_special_tokens)[0].ids

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._tokenizer.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    def text_stream(self, skip_special_tokens: bool = True) -> TextStream:
        """A new stream that turns one output's ids into text as they come: by table for a
        byte-level BPE tokenizer (~0.5 µs an id), else two windowed decodes an id (~4 µs)."""
        if self._byte_tables is not None:
            return ByteText(self._byte_tables[1 if skip_special_tokens else 0])
        return WindowText(
            functools.partial(self._tokenizer.decode, skip_special_tokens=skip_special_tokens)
        )

    def token_to_id(self, token: str) -> int | None:
        return self._tokenizer.token_to_id(token)

    def token_texts(self, token_ids: Sequence[int]) -> list[str]:
        """Each id's own text (special tokens included): logprob entries carry it."""
        if self._byte_tables is None:
            return self._tokenizer.decode_batch([[i] for i in token_ids], skip_special_tokens=False)
        table = self._byte_tables[0]  # read as the tokenizer's decode does (checked at start-up)
        return [table[i].decode("utf-8", "replace") if i < len(table) else "" for i in token_ids]

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        enable_thinking: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> str:
        """Renders the conversation (and the tools the model may call, OpenAI's shapes as in
        transformers' apply_chat_template) to prompt text; template errors name `messages`."""
        if self._template is None:
            raise ValueError("the model has no chat template")
        try:
            return self._template.render(
                messages=list(messages),
                add_generation_prompt=add_generation_prompt,
                enable_thinking=enable_thinking,
                bos_token=self.bos_token or "",
                eos_token=self.eos_token or "",
                tools=list(tools) if tools else None,
            )
        except jinja2.TemplateError as e:
            raise InvalidArgument(
                f"chat template rejected the conversation: {e}", field="messages"
            ) from None

    def encode_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        enable_thinking: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> list[int]:
        # The template writes every special token itself; adding them again would double a bos.
        if not self._special_text_in_messages and holds_special_text(messages, self.special_texts):
            return encode_escaped(
                messages,
                self.special_texts,
                lambda marked: self.apply_chat_template(marked, True, enable_thinking, tools),
                lambda text: self.encode(text, add_special_tokens=False),
                self._encode_text,
            )
        prompt = self.apply_chat_template(messages, enable_thinking=enable_thinking, tools=tools)
        return self.encode(prompt, add_special_tokens=False)

    def _encode_text(self, text: str) -> list[int]:
        """`text`'s ids with special-token text encoded as the text it is."""
        if self._text_only is None:
            self._text_only = HFTokenizer.from_str(self._tokenizer.to_str())
            self._text_only.encode_special_tokens = True
        return self._text_only.encode(text, add_special_tokens=False).ids

    async def _run_encode(self, size: int, fn: Any, *args: Any) -> list[int]:
        """Runs an encode of `size` characters in the pool; large ones one at a time. Each still
        holds the GIL at its end (a Python list of up to a million ids), and several such ends in
        a row would hold the event loop for as long."""
        loop = asyncio.get_running_loop()
        if size < LARGE_ENCODE_CHARS:
            return await loop.run_in_executor(self._executor, fn, *args)
        if self._large_encode is None:  # created on the loop that uses it
            self._large_encode = asyncio.Semaphore(1)
        async with self._large_encode:
            return await loop.run_in_executor(self._executor, fn, *args)

    async def encode_async(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return await self._run_encode(len(text), self.encode, text, add_special_tokens)

    async def encode_chat_async(
        self,
        messages: Sequence[Mapping[str, Any]],
        enable_thinking: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        size: int | None = None,
    ) -> list[int]:
        """`size`: the rendered prompt's characters, about (default: the contents')."""
        if size is None:
            size = sum(len(m.get("content", "")) for m in messages)
        return await self._run_encode(size, self.encode_chat, messages, enable_thinking, tools)

    async def run(self, fn: Any, *args: Any) -> Any:
        """Runs fn(*args) in the tokenizer's thread pool (large detokenizer steps)."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
