"""Structured output's checks that need no grammar engine (no torch): the frontend refuses a
constraint that is too long, empty, or a schema that is not JSON, naming the field; the Python
client builds the proto's oneof from keyword arguments; the worker's params carry it through a
msgpack frame."""

import json

import pytest

from nanoserve.client.requests import sampling_params, structured_output
from nanoserve.errors import InvalidArgument
from nanoserve.frontend.admission import Limits, validate_sampling_params
from nanoserve.proto.v1 import common_pb2
from nanoserve.structured_output import MAX_GRAMMAR_CHARS, from_proto

LIMITS = Limits(
    max_model_len=4096,
    vocab_size=151936,
    max_stop_strings=16,
    max_stop_string_length=64,
    max_prompt_bytes=1 << 20,
)


def test_client_builds_each_kind():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    p = sampling_params(structured_output={"json_schema": schema})
    assert from_proto(p.structured_output) == ("json_schema", json.dumps(schema))
    p = sampling_params(structured_output={"regex": "a+"})
    assert from_proto(p.structured_output) == ("regex", "a+")
    p = sampling_params(structured_output=structured_output(grammar='root ::= "x"'))
    assert from_proto(p.structured_output) == ("grammar", 'root ::= "x"')
    p = sampling_params(structured_output={"json_object": True})
    assert from_proto(p.structured_output) == ("json_object", "")
    tag = {"type": "structural_tag", "format": {"type": "const_string", "value": "hi"}}
    p = sampling_params(structured_output={"structural_tag": tag})
    assert from_proto(p.structured_output) == ("structural_tag", json.dumps(tag))
    p = sampling_params(structured_output={"structural_tag": '{"format": {}}'})
    assert from_proto(p.structured_output) == ("structural_tag", '{"format": {}}')
    assert from_proto(sampling_params().structured_output) is None
    with pytest.raises(ValueError, match="exactly one"):
        structured_output(regex="a", grammar="b")


@pytest.mark.parametrize(
    "message, field",
    [
        (common_pb2.StructuredOutput(json_schema="{oops"), "json_schema"),
        (common_pb2.StructuredOutput(json_schema='"a string"'), "json_schema"),
        (common_pb2.StructuredOutput(json_schema="[" * 100_000), "json_schema"),
        (common_pb2.StructuredOutput(regex=""), "regex"),
        (common_pb2.StructuredOutput(grammar="x" * (MAX_GRAMMAR_CHARS + 1)), "grammar"),
        (common_pb2.StructuredOutput(structural_tag=""), "structural_tag"),
        (common_pb2.StructuredOutput(structural_tag="{oops"), "structural_tag"),
        (common_pb2.StructuredOutput(structural_tag="[1]"), "structural_tag"),
        (
            common_pb2.StructuredOutput(structural_tag="{" + " " * MAX_GRAMMAR_CHARS + "}"),
            "structural_tag",
        ),
    ],
)
def test_frontend_refuses_naming_the_field(message, field):
    params = common_pb2.SamplingParams(structured_output=message)
    with pytest.raises(InvalidArgument) as e:
        validate_sampling_params(params, LIMITS)
    assert e.value.field == f"sampling_params.structured_output.{field}"


def test_frontend_passes_well_formed_constraints():
    for message in [
        common_pb2.StructuredOutput(json_schema='{"type": "object"}'),
        common_pb2.StructuredOutput(regex="[a-z]+"),
        common_pb2.StructuredOutput(json_object=True),
        common_pb2.StructuredOutput(structural_tag='{"type": "structural_tag", "format": {}}'),
    ]:
        validate_sampling_params(common_pb2.SamplingParams(structured_output=message), LIMITS)


def test_worker_params_cross_a_msgpack_frame():
    pytest.importorskip("torch")
    import msgpack

    from nanoserve.sampling import SamplingParams

    sp = SamplingParams(structured_output=("regex", "a+"))
    back = SamplingParams(**msgpack.unpackb(msgpack.packb(sp.as_fields())))
    assert back.structured_output == ("regex", "a+") and back == sp
    sp = SamplingParams(structured_output=("structural_tag", '{"format": {}}'))
    assert SamplingParams(**msgpack.unpackb(msgpack.packb(sp.as_fields()))) == sp
    with pytest.raises(ValueError, match=r"^structured_output\.json_schema: "):
        SamplingParams(structured_output=("json_schema", "{"))
