"""Structured output through the real frontend and worker: Generate with a JSON Schema returns JSON
text valid against it, a regex output matches, and a constraint that is malformed (refused by the
frontend) or does not compile (refused by the worker) is INVALID_ARGUMENT naming the field."""

import json
import re

import pytest

from nanoserve.client import Client
from nanoserve.errors import InvalidArgument
from tests.e2e.processes import assert_idle

pytestmark = pytest.mark.e2e
jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("xgrammar")

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}


def test_generate_with_constraints_and_invalid_ones(services) -> None:
    with Client(services.frontend.address, timeout=120) as client:
        for seed in range(3):
            out = client.generate(
                "Describe a person as JSON:",
                temperature=1.0,
                seed=seed,
                max_tokens=128,
                structured_output={"json_schema": SCHEMA},
            )
            assert out.finish_reason == "stop", out.text
            jsonschema.validate(json.loads(out.text), SCHEMA)
        out = client.generate(
            "A phone number:",
            temperature=1.0,
            max_tokens=32,
            structured_output={"regex": r"\d{3}-\d{4}"},
        )
        assert re.fullmatch(r"\d{3}-\d{4}", out.text), out.text
        for constraint, field in [
            ({"json_schema": "{not json"}, "sampling_params.structured_output.json_schema"),
            ({"regex": "x" * 70_000}, "sampling_params.structured_output.regex"),
            ({"json_schema": {"type": "nope"}}, "sampling_params.structured_output.json_schema"),
            ({"grammar": "root ::= nothing"}, "sampling_params.structured_output.grammar"),
            ({"regex": "(("}, "sampling_params.structured_output.regex"),
        ]:
            with pytest.raises(InvalidArgument, match=re.escape(field)):
                client.generate("hi", max_tokens=8, structured_output=constraint)
    assert_idle(services.worker.address)
