"""A request's structured-output constraint as plain values, and the checks that need no grammar
engine (size bound, one kind, JSON that parses). The schema runs them
(nanoserve.sampling's SamplingParams, at each door); the worker's engine core then compiles it
(worker/core/grammars.py), and a text that does not compile is INVALID_ARGUMENT too.
"""

import json

from nanoserve.proto.v1 import common_pb2

KINDS = ("json_schema", "regex", "grammar", "json_object", "structural_tag")
# the longest constraint text accepted (any kind): compile time and memory grow with it
MAX_GRAMMAR_CHARS = 64 * 1024
FIELD = "sampling_params.structured_output"  # as a request names it (the grammar compiler's)


def from_proto(p: common_pb2.StructuredOutput) -> tuple[str, str] | None:
    """(kind, text) of the oneof that is set ("" for json_object); None when none is set or
    json_object is false."""
    kind = p.WhichOneof("kind")
    if kind is None or (kind == "json_object" and not p.json_object):
        return None
    return kind, "" if kind == "json_object" else getattr(p, kind)


def check(kind: str, spec: str, max_chars: int = MAX_GRAMMAR_CHARS) -> tuple[str, str] | None:
    """(SamplingParams field, what is wrong) for a constraint that can never compile, else None."""
    if kind not in KINDS:
        return "structured_output", f"unknown kind {kind!r} (one of {', '.join(KINDS)})"
    field = f"structured_output.{kind}"
    if kind == "json_object":
        return None
    if not spec:
        return field, "must not be empty"
    if len(spec) > max_chars:
        return field, f"longer than {max_chars} characters ({len(spec)})"
    if kind in ("json_schema", "structural_tag"):
        try:
            value = json.loads(spec)
        except (ValueError, RecursionError) as e:
            return field, f"not JSON: {e}"
        if kind == "json_schema" and not isinstance(value, (dict, bool)):
            return field, "a JSON Schema is an object (or true / false)"
        if kind == "structural_tag" and not isinstance(value, dict):
            return field, 'a structural tag is a JSON object ({"type": "structural_tag", ...})'
    return None
