"""Structured output: compiles a request's JSON Schema, regex, EBNF grammar or structural tag
(xgrammar) on a thread off the engine loop, cached by (kind, text); keeps each sequence's matcher;
fills the token bitmask of the rows that have one.

LLMEngine.add_request hands a constrained sequence to Grammars.submit and admits it to the
scheduler once compiled (take_ready), so a compile never stalls other sequences.
SamplingInputs.prepare asks for the step's bitmask (sampled rows with a grammar only); sample()
masks those rows' logits; Scheduler.postprocess advances the matcher by the sampled token and ends
the sequence when the grammar is terminated (the eos is allowed only then). The bitmask is filled
when the step samples, after the previous token was accepted: a decode step forwarded ahead
(worker.runner.lookahead) needs no mask, so lookahead and CUDA graphs run as without a grammar.
"""

import concurrent.futures as cf
import json
import logging
import re
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch

from nanoserve.structured_output import FIELD
from nanoserve.worker.sequence import Sequence

logger = logging.getLogger(__name__)

CACHE_SIZE = 256  # compiled grammars kept (least recently used out)
# xgrammar prefixes its errors with "[time] /path/file.cc:line: ", some with the failed check
# ("Check failed: (cond) is false: ")
_ERROR_PREFIX = re.compile(r"^\[[^\]]*\]\s+\S+:\d+:\s*(?:Check failed: .*? is false:\s*)?")


class Grammar:
    """One sequence's matcher, advanced by each token the sequence samples."""

    __slots__ = ("compiled", "matcher")

    def __init__(self, matcher: Any, compiled: Any):
        self.matcher = matcher  # xgrammar.GrammarMatcher
        self.compiled = compiled  # its xgrammar.CompiledGrammar (shared, cached)

    def fresh(self) -> "Grammar":
        """A matcher of the same grammar at its start: for a fork (n > 1), whose first token is
        sampled after the parent's."""
        import xgrammar as xgr

        return Grammar(xgr.GrammarMatcher(self.compiled), self.compiled)

    def accept(self, token_id: int) -> bool:
        """Advance by token_id; True when the output is complete (the grammar is terminated) or
        the token was refused (never for a token the mask allowed)."""
        if not self.matcher.accept_token(token_id):
            logger.warning("grammar refused token %d: the sequence ends", token_id)
            return True
        return self.matcher.is_terminated()

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        """Row `row` of a (G, ceil(V/32)) int32 bitmask: the tokens allowed next."""
        self.matcher.fill_next_token_bitmask(bitmask, row)


class Grammars:
    """Compiles constraints on one thread (xgrammar, imported there on first use) and holds the
    sequences waiting for theirs."""

    def __init__(self, model_dir: str, vocab_size: int, eos_token_ids: tuple[int, ...]):
        self.model_dir, self.vocab_size = model_dir, vocab_size
        self.eos_token_ids = [t for t in eos_token_ids if t < vocab_size]
        self.pool = cf.ThreadPoolExecutor(1, thread_name_prefix="grammar-compile")
        self.lock = threading.Lock()  # the cache: the engine thread reads, the pool fills
        self.cache: OrderedDict[tuple[str, str], cf.Future] = OrderedDict()
        self.compiler: Any = None  # xgrammar.GrammarCompiler, built by the first compile
        self.waiting: dict[Sequence, cf.Future] = {}  # sequences whose grammar compiles

    # ---- compile (pool thread) --------------------------------------------------------------

    def _make_compiler(self) -> Any:
        import xgrammar as xgr

        path = Path(self.model_dir) / "tokenizer.json"
        try:
            tj = json.loads(path.read_text())
        except OSError as e:
            raise ValueError(f"{FIELD}: needs the model's tokenizer.json ({e})") from None
        # the vocabulary as the byte-level BPE strings of tokenizer.json, by id (no tokenizer
        # library: the worker only reads the table); ids without a token are never allowed
        vocab_table = {
            **tj["model"]["vocab"],
            **{a["content"]: a["id"] for a in tj["added_tokens"]},
        }
        encoded = [""] * min(self.vocab_size, max(vocab_table.values()) + 1)
        for token, i in vocab_table.items():
            if i < len(encoded):
                encoded[i] = token
        info = xgr.TokenizerInfo(
            encoded,
            vocab_type=xgr.VocabType.BYTE_LEVEL,
            vocab_size=self.vocab_size,
            stop_token_ids=self.eos_token_ids,
        )
        # one thread: the engine loop keeps the other cores (xgrammar's cache is off, ours keys it)
        return xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)

    def _compile(self, kind: str, spec: str) -> Any:
        if self.compiler is None:
            self.compiler = self._make_compiler()
        c = self.compiler
        try:
            if kind == "json_schema":
                # no free whitespace: a model could pad forever between tokens
                return c.compile_json_schema(spec, any_whitespace=False)
            if kind == "regex":
                return c.compile_regex(spec)
            if kind == "grammar":
                return c.compile_grammar(spec)
            if kind == "structural_tag":
                return c.compile_structural_tag(spec)  # JSON text: parsed by xgrammar's C++
            return c.compile_json_schema('{"type": "object"}', any_whitespace=False)
        except (RuntimeError, ValueError, TypeError) as e:
            message = _ERROR_PREFIX.sub("", str(e).strip().splitlines()[0] if str(e) else "")
            raise ValueError(f"{FIELD}.{kind}: does not compile: {message}") from None

    def compiled(self, key: tuple[str, str]) -> cf.Future:
        """The future of key's compiled grammar (shared by every request with the same key)."""
        with self.lock:
            fut = self.cache.get(key)
            if fut is not None:
                self.cache.move_to_end(key)
                return fut
            fut = self.pool.submit(self._compile, *key)
            self.cache[key] = fut
            if len(self.cache) > CACHE_SIZE:
                self.cache.popitem(last=False)
            return fut

    def check(self, key: tuple[str, str]) -> None:
        """Compile now (ValueError naming the field): the offline API validates before it runs."""
        self.compiled(key).result()

    # ---- sequences (engine thread) -----------------------------------------------------------

    def submit(self, seq: Sequence) -> None:
        key = seq.sampling_params.structured_output
        assert key is not None
        self.waiting[seq] = self.compiled(key)

    def take_ready(self) -> tuple[list[Sequence], list[tuple[Sequence, str]]]:
        """Sequences whose grammar compiled (their matcher set), and (sequence, error) for those
        whose grammar does not compile."""
        ready: list[Sequence] = []
        failed: list[tuple[Sequence, str]] = []
        for seq, fut in list(self.waiting.items()):
            if not fut.done():
                continue
            del self.waiting[seq]
            error = fut.exception()
            if error is not None:
                failed.append((seq, str(error)))
                continue
            import xgrammar as xgr

            seq.grammar = Grammar(xgr.GrammarMatcher(fut.result()), fut.result())
            ready.append(seq)
        return ready, failed

    def wait(self, timeout: float) -> None:
        """Block until a waiting grammar is compiled or timeout (the engine has nothing else)."""
        cf.wait(list(self.waiting.values()), timeout, return_when=cf.FIRST_COMPLETED)

    def abort(self, seq: Sequence) -> bool:
        return self.waiting.pop(seq, None) is not None

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
