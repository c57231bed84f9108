"""SamplingParams on the wire (common.proto): built from a client's keyword arguments (to_proto), read
into the schema at a service's door (from_proto: each list counted before it is read), and the
worker's copy of a request, without the fields only the frontend reads (for_worker).
"""

import json
from collections.abc import Mapping
from typing import Any

from nanoserve.errors import echo
from nanoserve.proto.v1 import common_pb2
from nanoserve.sampling import (
    DEFAULTS,
    FRONTEND_ONLY,
    MAX_ALLOWED_TOKEN_IDS,
    MAX_LOGIT_BIAS,
    SCHEMA,
    Limits,
    SamplingError,
    SamplingParams,
)
from nanoserve.structured_output import from_proto as structured_output_from_proto

_PROTO = common_pb2.SamplingParams.DESCRIPTOR.fields_by_name
# proto3 `optional` scalars (presence known); the rest are repeated, a map or a message
_SCALARS = tuple(
    f.name
    for f in SCHEMA
    if f.name != "logprobs_mode" and _PROTO[f.name].has_presence and not _PROTO[f.name].message_type
)
_WORKER_SCALARS = tuple(name for name in _SCALARS if name not in FRONTEND_ONLY)
_MODES = {
    common_pb2.LOGPROBS_MODE_UNSPECIFIED: "raw",
    common_pb2.LOGPROBS_MODE_RAW: "raw",
    common_pb2.LOGPROBS_MODE_PROCESSED: "processed",
}


def from_proto(
    p: common_pb2.SamplingParams, limits: Limits, frontend: bool = True
) -> SamplingParams:
    """The checked params of a request (SamplingError naming the field). Unset fields are unset
    here too: max_tokens None fills the context (resolve_max_tokens), the model's defaults fill
    the rest. Lists are counted against their bounds before any element is read. `frontend`:
    False reads none of FRONTEND_ONLY (the worker ignores them)."""
    for name, count, bound, noun in (
        ("stop", len(p.stop) if frontend else 0, limits.max_stop_strings, "stop strings"),
        ("stop_token_ids", len(p.stop_token_ids), limits.max_stop_token_ids, "stop token ids"),
        ("logit_bias", len(p.logit_bias), MAX_LOGIT_BIAS, "entries"),
        ("allowed_token_ids", len(p.allowed_token_ids), MAX_ALLOWED_TOKEN_IDS, "ids"),
    ):
        if count > bound:
            raise SamplingError(name, f"at most {bound} {noun}, got {count}")
    if p.logprobs_mode not in _MODES:
        raise SamplingError("logprobs_mode", f"unknown value {p.logprobs_mode}")
    scalars = _SCALARS if frontend else _WORKER_SCALARS
    kw: dict[str, Any] = {name: getattr(p, name) for name in scalars if p.HasField(name)}
    kw.setdefault("max_tokens", None)  # unset: fill the context (the dataclass's 16 is offline's)
    params = SamplingParams(
        **kw,
        logprobs_mode=_MODES[p.logprobs_mode],
        stop=tuple(p.stop) if frontend else (),
        stop_token_ids=tuple(p.stop_token_ids),
        structured_output=structured_output_from_proto(p.structured_output),
        # empty is unset (proto3)
        logit_bias=dict(p.logit_bias) if p.logit_bias else None,
        allowed_token_ids=tuple(p.allowed_token_ids) if p.allowed_token_ids else None,
    )
    params.check(limits)
    return params


def for_worker(params: SamplingParams, max_tokens: int) -> common_pb2.SamplingParams:
    """The worker's message of checked params: max_tokens resolved, the fields left unset unset
    (the model's defaults fill them), FRONTEND_ONLY left out, defaults not spelled out."""
    out = common_pb2.SamplingParams(max_tokens=max_tokens)
    for name in _WORKER_SCALARS:
        value = getattr(params, name)
        if name != "max_tokens" and name not in params.unset and value != DEFAULTS[name]:
            setattr(out, name, value)
    if params.logprobs_mode != "raw":
        out.logprobs_mode = common_pb2.LOGPROBS_MODE_PROCESSED
    out.stop_token_ids.extend(params.stop_token_ids)
    if params.structured_output is not None:
        kind, text = params.structured_output
        setattr(out.structured_output, kind, True if kind == "json_object" else text)
    if params.logit_bias is not None:
        out.logit_bias.update(params.logit_bias)
    if params.allowed_token_ids is not None:
        out.allowed_token_ids.extend(params.allowed_token_ids)
    return out


def to_proto(**kwargs: Any) -> common_pb2.SamplingParams:
    """The message of vLLM-named keyword arguments (a client's): `stop` may be one string,
    `logit_bias` a {token id: bias} dict whose ids may be strings (OpenAI's JSON shape),
    `logprobs_mode` "raw" or "processed", `structured_output` structured_output()'s keywords.
    Values are the frontend's to check; a shape that cannot be sent raises SamplingError."""
    unknown = set(kwargs).difference(_PROTO)
    if unknown:
        raise TypeError(f"unknown sampling parameters: {sorted(unknown)}")
    if isinstance(kwargs.get("stop"), str):
        kwargs["stop"] = [kwargs["stop"]]
    if isinstance(kwargs.get("logit_bias"), Mapping):
        kwargs["logit_bias"] = {_token_key(k): v for k, v in kwargs["logit_bias"].items()}
    mode = kwargs.get("logprobs_mode")
    if isinstance(mode, str):
        if mode not in ("raw", "processed"):
            raise SamplingError("logprobs_mode", f"must be raw or processed, got {echo(mode)}")
        kwargs["logprobs_mode"] = common_pb2.LogprobsMode.Value(f"LOGPROBS_MODE_{mode.upper()}")
    if isinstance(kwargs.get("structured_output"), Mapping):
        kwargs["structured_output"] = structured_output(**kwargs["structured_output"])
    return common_pb2.SamplingParams(**{k: v for k, v in kwargs.items() if v is not None})


def structured_output(
    json_schema: Mapping[str, Any] | bool | str | None = None,
    regex: str | None = None,
    grammar: str | None = None,
    json_object: bool = False,
    structural_tag: Mapping[str, Any] | str | None = None,
) -> common_pb2.StructuredOutput:
    """What the output must match, exactly one of: a JSON Schema (a dict, or its JSON text), a
    regex, an EBNF grammar (GBNF dialect, rule `root`), any JSON object, or an xgrammar structural
    tag (a dict, or its JSON text). Passed to the calls as
    `structured_output={"json_schema": {...}}` (this dict's keywords) or this message."""
    given = [v is not None for v in (json_schema, regex, grammar, structural_tag)]
    if sum(given) + bool(json_object) != 1:
        raise ValueError(
            "structured_output: give exactly one of json_schema, regex, grammar, json_object, "
            "structural_tag"
        )
    if json_object:
        return common_pb2.StructuredOutput(json_object=True)
    if regex is not None:
        return common_pb2.StructuredOutput(regex=regex)
    if grammar is not None:
        return common_pb2.StructuredOutput(grammar=grammar)
    if structural_tag is not None:
        return common_pb2.StructuredOutput(structural_tag=json_text(structural_tag))
    schema = json_schema if isinstance(json_schema, str) else json.dumps(json_schema)
    return common_pb2.StructuredOutput(json_schema=schema)


def json_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _token_key(key: int | str) -> int:
    """A logit_bias key: a token id, or its decimal text (a JSON object's keys are strings)."""
    if isinstance(key, str) and key.isascii() and key.isdigit():
        key = int(key)
    if isinstance(key, bool) or not isinstance(key, int) or not 0 <= key < 2**32:
        raise SamplingError("logit_bias", f"keys must be token ids, got {echo(str(key))}")
    return key
