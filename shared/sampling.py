"""The request's sampling schema, in one place: SamplingParams (vLLM's names), each field with its
default, range rule, help text and CLI flag. Built from a proto (sampling_proto) or by offline
users; `check(limits)` names the field a request breaks. Checked once at each door (frontend, the
worker's gRPC process, the offline LLM); the engine core trusts its frames (`trusted`).
"""

import hashlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from nanoserve.sampling_limits import (  # noqa: F401 - the schema's names, with it
    DEFAULT_MAX_STOP_TOKEN_IDS,
    MAX_ALLOWED_TOKEN_IDS,
    MAX_BIAS,
    MAX_LOGIT_BIAS,
    Limits,
    SamplingError,
    bias_dict,
    bounded_tuple,
    check_logit_bias,
    check_prompt,
    check_token_ids,
    resolve_max_tokens,
)
from nanoserve.structured_output import check as check_structured_output

MAX_N = 16  # completions per request: each takes one of the engine's batch slots
MAX_LOGPROBS = 20  # top alternatives per position (OpenAI's top_logprobs bound; vLLM's default)
LOGPROBS_MODES = ("raw", "processed")


def _spec(
    help: str,
    rule: tuple[Callable[[Any], bool], str] | None = None,
    *,
    default: Any = None,
    fallback: float | None = None,
    flag: str | None = None,
    metavar: str | None = None,
    frontend: bool = False,
) -> Any:
    """A field with its schema: `rule` (predicate, text) on a given value; `fallback`: vLLM's value
    of a field the model's generation_config.json may set (None = unset, filled by the engine);
    `flag`: the shape of its `nanoserve generate` flag (nanoserve.cli.generate_args); `frontend`: read
    by the frontend only (the worker never sees it)."""
    meta = dict(help=help, rule=rule, fallback=fallback, flag=flag, metavar=metavar)
    meta["frontend"] = frontend
    return field(default=default, metadata=meta)


def _finite(ok: Callable[[float], bool]) -> Callable[[float], bool]:
    return lambda v: math.isfinite(v) and ok(v)


# (predicate, what it asks) of a given value
_TEMPERATURE = (_finite(lambda v: v >= 0), "a finite number >= 0")
_UNIT = (_finite(lambda v: 0 <= v <= 1), "in [0, 1]")
_TOP_P = (_finite(lambda v: 0 < v <= 1), "in (0, 1]")
_TOP_K = (lambda v: v >= -1, "-1 or 0 (disabled) or positive")
_POSITIVE = (lambda v: v >= 1, ">= 1")
_COUNT = (lambda v: v >= 0, ">= 0")
_IDS = (lambda ids: min(ids, default=0) >= 0, "ids >= 0")
_REPETITION = (_finite(lambda v: v > 0), "a finite number > 0")
_PENALTY = (_finite(lambda v: -2 <= v <= 2), "a finite number in [-2, 2]")
_N = (lambda v: 1 <= v <= MAX_N, f"in [1, {MAX_N}]")
_LOGPROBS = (lambda v: 0 <= v <= MAX_LOGPROBS, f"in [0, {MAX_LOGPROBS}]")
_MODE = (lambda v: v in LOGPROBS_MODES, f"one of {LOGPROBS_MODES}")


@dataclass(frozen=True, slots=True)
class SamplingParams:
    temperature: float | None = _spec("0 = greedy", _TEMPERATURE, fallback=1.0, flag="float")
    top_p: float | None = _spec(
        "nucleus: smallest set of tokens with this probability", _TOP_P, fallback=1.0, flag="float"
    )
    top_k: int | None = _spec(
        "sample among the k likeliest tokens", _TOP_K, fallback=-1, flag="int"
    )
    min_p: float | None = _spec(
        "drop tokens below min_p x the likeliest token's probability",
        _UNIT,
        fallback=0.0,
        flag="float",
    )
    seed: int | None = _spec("seed of this request's sampling", flag="int")
    max_tokens: int | None = _spec("most tokens to generate", _POSITIVE, default=16, flag="int")
    min_tokens: int = _spec(
        "fewest tokens before a stop may end the reply", _COUNT, default=0, flag="int"
    )
    stop_token_ids: tuple[int, ...] = _spec(
        "token ids that end the reply", _IDS, default=(), flag="ids"
    )
    ignore_eos: bool = _spec(
        "keep generating past end-of-sequence tokens", default=False, flag="switch"
    )
    repetition_penalty: float | None = _spec(
        "> 1 discourages tokens already in prompt or reply", _REPETITION, fallback=1.0, flag="float"
    )
    presence_penalty: float = _spec(
        "subtracted from the logits of tokens already generated",
        _PENALTY,
        default=0.0,
        flag="float",
    )
    frequency_penalty: float = _spec(
        "subtracted per occurrence in the reply so far", _PENALTY, default=0.0, flag="float"
    )
    n: int = _spec("completions of the prompt, sharing its KV blocks", _N, default=1, flag="int")
    logprobs: int | None = _spec(
        "the logprob of each generated token and its K likeliest alternatives", _LOGPROBS,
        flag="int", metavar="K",
    )  # fmt: skip
    prompt_logprobs: int | None = _spec("the same for the prompt tokens", _LOGPROBS)
    logprobs_mode: str = _spec(
        "raw: log_softmax of the logits; processed: as sampled", _MODE, default="raw"
    )
    # (kind, text): a JSON Schema, regex, EBNF grammar, xgrammar structural tag or any JSON object
    # (kinds: nanoserve.structured_output.KINDS; text "" for json_object); None: free text
    structured_output: tuple[str, str] | None = _spec("what the output must match")
    # OpenAI's logit_bias: token id -> bias, added to the logits before sampling
    logit_bias: Mapping[int, float] | None = _spec(
        "add BIAS, in [-100, 100], to token ID's logit: 100 forces it, -100 bans it", flag="bias",
        metavar="ID=BIAS",
    )  # fmt: skip
    # vLLM's allowed_token_ids: only these ids may be sampled (not empty); None: every token
    allowed_token_ids: Sequence[int] | None = _spec("sample only these token ids", flag="ids")
    # read by the frontend, on the detokenized text (the offline LLM and the worker refuse them)
    stop: tuple[str, ...] = _spec("stop string", default=(), flag="text", frontend=True)
    include_stop_str_in_output: bool = _spec(
        "keep the matched stop string", default=False, frontend=True
    )
    skip_special_tokens: bool = _spec(
        "leave special tokens out of the text", default=True, frontend=True
    )
    detokenize: bool = _spec(
        "false: token ids only, no text (stop strings need text)",
        default=True,
        flag="switch",
        frontend=True,
    )
    # the fallback fields that were not given (they hold vLLM's value until with_defaults)
    unset: frozenset[str] = field(default=frozenset(), init=False, repr=False, compare=False)
    # logit_bias or allowed_token_ids is set: a plain field, read for every row of every step
    has_token_rules: bool = field(default=False, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        """Normalizes the containers (lists, counted before they are read) and checks every given
        value against its rule: SamplingError naming the field."""
        self._normalize()
        for f in SCHEMA:
            rule = f.metadata["rule"]
            value = getattr(self, f.name)
            if rule is not None and value is not None and not _holds(rule[0], value):
                raise SamplingError(f.name, f"must be {rule[1]}, got {value!r}")
        if self.stop and not self.detokenize:
            raise SamplingError("stop", "stop strings match the output text: they need detokenize")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise SamplingError("min_tokens", f"must be <= max_tokens ({self.max_tokens})")
        if self.structured_output is not None:
            problem = check_structured_output(*self.structured_output)
            if problem is not None:
                raise SamplingError(*problem)
        if self.logit_bias is not None:
            check_logit_bias(self.logit_bias, None)
        if self.allowed_token_ids is not None:
            check_token_ids(self.allowed_token_ids, None)
        self._fill_unset()

    @classmethod
    def trusted(cls, values: Mapping[str, Any]) -> "SamplingParams":
        """Params that a door checked already (a frame from the worker's gRPC process, as_fields):
        normalized, not checked again."""
        params = object.__new__(cls)
        for f in SCHEMA:
            object.__setattr__(params, f.name, values.get(f.name, DEFAULTS[f.name]))
        params._normalize()
        params._fill_unset()
        return params

    def _normalize(self) -> None:
        def put(name: str, value: Any) -> None:
            object.__setattr__(self, name, value)

        put("stop", bounded_tuple(self.stop, "stop", MAX_ALLOWED_TOKEN_IDS, "stop strings"))
        put(
            "stop_token_ids",
            bounded_tuple(self.stop_token_ids, "stop_token_ids", MAX_ALLOWED_TOKEN_IDS),
        )
        if self.structured_output is not None:
            kind, text = self.structured_output  # a list on the far side of a msgpack frame
            put("structured_output", (kind, text))
        if self.logit_bias is not None:
            put("logit_bias", bias_dict(self.logit_bias))
        if self.allowed_token_ids is not None:
            ids = bounded_tuple(self.allowed_token_ids, "allowed_token_ids", MAX_ALLOWED_TOKEN_IDS)
            put("allowed_token_ids", ids)
        put("has_token_rules", self.logit_bias is not None or self.allowed_token_ids is not None)

    def _fill_unset(self) -> None:
        unset = frozenset(name for name in FALLBACKS if getattr(self, name) is None)
        for name in unset:
            object.__setattr__(self, name, FALLBACKS[name])
        object.__setattr__(self, "unset", unset)

    def check(self, limits: Limits, prompt_len: int | None = None) -> None:
        """The rules that depend on the engine (and on the prompt's length when it is given):
        SamplingError naming the field. The ranges were checked when the params were built."""
        vocab = limits.vocab_size
        if limits.max_num_seqs is not None and self.n > limits.max_num_seqs:
            raise SamplingError(
                "n", f"{self.n} completions exceed max_num_seqs ({limits.max_num_seqs})"
            )
        if len(self.stop) > limits.max_stop_strings:
            raise SamplingError(
                "stop", f"at most {limits.max_stop_strings} stop strings, got {len(self.stop)}"
            )
        for i, stop in enumerate(self.stop):
            if not stop:
                raise SamplingError(f"stop[{i}]", "must not be empty")
            if len(stop) > limits.max_stop_string_length:
                raise SamplingError(
                    f"stop[{i}]", f"longer than {limits.max_stop_string_length} characters"
                )
        if len(self.stop_token_ids) > limits.max_stop_token_ids:
            raise SamplingError(
                "stop_token_ids",
                f"at most {limits.max_stop_token_ids} stop token ids, got {len(self.stop_token_ids)}",
            )
        check_token_ids(self.stop_token_ids, vocab, "stop_token_ids", allow_empty=True)
        if self.logit_bias is not None:
            check_logit_bias(self.logit_bias, vocab)
        if self.allowed_token_ids is not None:
            check_token_ids(self.allowed_token_ids, vocab)
            ends = set(self.stop_token_ids) | set(() if self.ignore_eos else limits.eos_token_ids)
            if self.min_tokens > 0 and ends.issuperset(self.allowed_token_ids):
                raise SamplingError(
                    "allowed_token_ids",
                    "every allowed id ends the output (an eos or stop token id), so "
                    f"min_tokens {self.min_tokens} could not be met",
                )
        if prompt_len is not None:
            resolve_max_tokens(self.max_tokens, self.min_tokens, prompt_len, limits.max_model_len)

    def as_fields(self) -> dict:
        """The fields as plain values (unset ones as None), for a msgpack frame: `trusted` rebuilds
        these params in the engine core."""
        out = {f.name: None if f.name in self.unset else getattr(self, f.name) for f in SCHEMA}
        if self.logit_bias is not None:  # msgpack maps take str keys only: [id, bias] pairs
            out["logit_bias"] = list(self.logit_bias.items())
        return out

    def with_defaults(self, defaults: Mapping[str, float]) -> "SamplingParams":
        """These params with their unset fields taken from `defaults` (a model's
        generation_config.json sampling fields: ModelConfig.sampling_defaults)."""
        changes = {name: defaults[name] for name in self.unset if name in defaults}
        return self.copy_with(changes) if changes else self

    def for_completion(self, index: int) -> "SamplingParams":
        """The params of completion `index` of n: a seeded request's completions draw from
        distinct seed streams, derived from the seed (index 0 keeps it: n = 1 is unchanged)."""
        if self.seed is None or index == 0:
            return self
        digest = hashlib.blake2b(f"{self.seed}/{index}".encode(), digest_size=8).digest()
        # in [0, 2**63), like any int64 seed (worker.runner.seeded_noise)
        return self.copy_with({"seed": int.from_bytes(digest, "little") >> 1})

    def copy_with(self, changes: Mapping[str, Any]) -> "SamplingParams":
        """A copy with `changes`, values the caller checked (dataclasses.replace would take the
        fallbacks that unset fields hold for given values)."""
        params = object.__new__(SamplingParams)
        for name in SamplingParams.__slots__:
            object.__setattr__(params, name, changes.get(name, getattr(self, name)))
        object.__setattr__(params, "unset", self.unset - changes.keys())
        rules = params.logit_bias is not None or params.allowed_token_ids is not None
        object.__setattr__(params, "has_token_rules", rules)
        return params

    @property
    def knobs(self) -> tuple[float, int, float, float]:
        """(temperature, top_k, top_p, min_p): never None once built (unset ones hold fallbacks)."""
        temperature, top_k, top_p, min_p = self.temperature, self.top_k, self.top_p, self.min_p
        assert temperature is not None and top_k is not None
        assert top_p is not None and min_p is not None
        return temperature, top_k, top_p, min_p

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1

    @property
    def has_penalties(self) -> bool:
        return (
            self.repetition_penalty != 1.0
            or self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
        )


SCHEMA = tuple(f for f in fields(SamplingParams) if f.init)  # the request's fields, in order
FALLBACKS = {f.name: f.metadata["fallback"] for f in SCHEMA if f.metadata["fallback"] is not None}
DEFAULTS = {
    f.name: None if f.default is MISSING else f.default for f in SCHEMA
}  # what a field holds when not given
FRONTEND_ONLY = tuple(f.name for f in SCHEMA if f.metadata["frontend"])


def range_violation(name: str, value: float) -> str | None:
    """The rule a value of field `name` breaks (a generation_config.json default), else None."""
    rule = next(f.metadata["rule"] for f in SCHEMA if f.name == name)
    return None if rule is None or _holds(rule[0], value) else rule[1]


def _holds(ok: Callable[[Any], bool], value: Any) -> bool:
    try:
        return bool(ok(value))
    except TypeError:  # a value of the wrong type
        return False
