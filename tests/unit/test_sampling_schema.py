"""Every SamplingParams field walked through the doors: an OpenAI body (the gateway's mapping, the
client's proto, the frontend's check) and a gRPC request (the frontend's, then the worker's) to the
engine core's trusted copy. A bad value is refused naming the field the client sent; a good one
arrives at the sampler unchanged."""

import math

import msgpack
import pytest
from pydantic import ValidationError

from nanoserve.client.requests import sampling_params as client_proto
from nanoserve.errors import InvalidArgument
from nanoserve.frontend.admission import Limits, resolve_max_tokens, validate_sampling_params
from nanoserve.frontend.gateway.errors import (
    OpenAIError,
    from_service_error,
    from_validation_errors,
)
from nanoserve.frontend.gateway.params import SAMPLING, map_completion
from nanoserve.frontend.gateway.protocol import CompletionRequest
from nanoserve.proto.v1 import common_pb2
from nanoserve.proto.v1 import worker_service_pb2 as worker_pb2
from nanoserve.sampling import FRONTEND_ONLY, SCHEMA, SamplingError, SamplingParams
from nanoserve.sampling_proto import for_worker
from nanoserve.worker.service.admission import admit

LIMITS = Limits(max_model_len=4096, vocab_size=1000, eos_token_ids=(2,), max_num_seqs=64)
# field -> (a value its rule or the limits refuse, a good value other than its default)
VALUES = {
    "temperature": (-0.5, 0.5),
    "top_p": (1.5, 0.75),
    "top_k": (-2, 40),
    "min_p": (1.1, 0.25),
    "seed": (None, 1234),  # any int64 passes; a proto cannot hold another
    "max_tokens": (-1, 100),
    "min_tokens": (-1, 3),
    "stop_token_ids": ([1000], [7, 8]),
    "ignore_eos": (None, True),
    "repetition_penalty": (0.0, 1.25),
    "presence_penalty": (2.5, 0.5),
    "frequency_penalty": (-3.0, -0.5),
    "n": (65, 3),  # past max_num_seqs
    "logprobs": (21, 5),
    "prompt_logprobs": (21, 2),
    "logprobs_mode": ("softmax", "processed"),
    "structured_output": ({"regex": ""}, {"regex": "[a-z]+"}),
    "logit_bias": ({"5": 500.0}, {"5": -100.0, "17": 2.5}),
    "allowed_token_ids": ([1, 1000], [3, 4, 5]),
    "stop": ([""], ["\n\n"]),
    "include_stop_str_in_output": (None, True),
    "skip_special_tokens": (None, False),
    "detokenize": (None, False),
}
REFUSED = [name for name, (bad, _) in VALUES.items() if bad is not None]
OPENAI_NAMES = {field: name for name, field in SAMPLING.items() if name != "max_completion_tokens"}


def test_the_table_covers_the_schema():
    assert sorted(VALUES) == sorted(f.name for f in SCHEMA)


def _worker_request(params: common_pb2.SamplingParams) -> worker_pb2.GenerateTokensRequest:
    return worker_pb2.GenerateTokensRequest(prompt_token_ids=[1, 2, 3], sampling_params=params)


class _Engine:
    """What request_proto.admit reads of an AsyncEngine; add() keeps what reached the core."""

    num_requests = 0
    limits = LIMITS

    def add(self, request_id, token_ids, sp, **kwargs):
        # the pipe to the engine core: a msgpack frame, rebuilt there without a check
        self.core = SamplingParams.trusted(msgpack.unpackb(msgpack.packb(sp.as_fields())))
        return self.core


@pytest.mark.parametrize("name", REFUSED)
def test_grpc_refusals_name_the_field(name):
    with pytest.raises(InvalidArgument) as refused:  # by the client, or by the frontend
        proto = client_proto(**{name: VALUES[name][0]})
        resolve_max_tokens(validate_sampling_params(proto, LIMITS), 3, LIMITS)
    assert refused.value.message.startswith(f"sampling_params.{name}")
    if name == "logprobs_mode":  # an enum value no client library would send
        proto = common_pb2.SamplingParams(logprobs_mode=7)
        with pytest.raises(InvalidArgument, match="^sampling_params.logprobs_mode"):
            validate_sampling_params(proto, LIMITS)
    if name in FRONTEND_ONLY:
        return  # the worker never reads them
    with pytest.raises(InvalidArgument) as refused:  # sent to the worker directly
        admit(_Engine(), _worker_request(proto), "r", 16)  # type: ignore[arg-type]
    assert refused.value.message.startswith(f"sampling_params.{name}")


@pytest.mark.parametrize("name", [n for n in REFUSED if n in OPENAI_NAMES])
def test_openai_refusals_name_the_parameter(name):
    param = OPENAI_NAMES[name]
    mapped = None
    try:
        _, mapped = map_completion(
            CompletionRequest(model="m", prompt="hi", **{param: VALUES[name][0]})
        )
        validate_sampling_params(client_proto(**mapped.sampling), LIMITS)
    except ValidationError as e:  # the body's own types refuse it first
        error = from_validation_errors(e.errors())
    except OpenAIError as e:
        error = e
    except InvalidArgument as e:
        assert mapped is not None
        error = from_service_error(e, mapped.param_names)
    else:
        pytest.fail(f"{param}={VALUES[name][0]!r} was not refused")
    assert error.status == 400 and error.param.split("[")[0] == param, error.message


@pytest.mark.parametrize("name", list(VALUES))
def test_a_good_value_reaches_the_engine_core_unchanged(name):
    good = VALUES[name][1]
    params = validate_sampling_params(client_proto(**{name: good}), LIMITS)
    engine = _Engine()
    expected = SamplingParams(**{"max_tokens": 16, name: _as_field(name, good)})
    admit(engine, _worker_request(for_worker(params, expected.max_tokens)), "r", 200)  # type: ignore[arg-type]
    for f in SCHEMA:
        if f.name not in FRONTEND_ONLY:
            assert getattr(engine.core, f.name) == getattr(expected, f.name), f.name
        else:  # read by the frontend's detokenizer, never sent on
            assert getattr(params, f.name) == getattr(expected, f.name), f.name
    assert engine.core.unset == expected.unset  # the model's defaults still fill the rest


def _as_field(name: str, value):
    if name == "logit_bias":
        return {int(k): v for k, v in value.items()}
    if name == "structured_output":
        return next(iter(value.items()))
    return value


@pytest.mark.parametrize(
    "name, value",
    [("temperature", math.nan), ("top_p", math.inf), ("top_p", 0.0), ("n", 0), ("n", 17)],
)
def test_offline_params_refuse_at_construction(name, value):
    with pytest.raises(SamplingError, match=f"^{name}: must be"):
        SamplingParams(**{name: value})


def test_min_tokens_is_bounded_by_max_tokens():
    with pytest.raises(SamplingError, match=r"^min_tokens: must be <= max_tokens \(4\)"):
        SamplingParams(min_tokens=5, max_tokens=4)
    with pytest.raises(InvalidArgument, match=r"^sampling_params.min_tokens"):
        resolve_max_tokens(SamplingParams(min_tokens=5, max_tokens=None), 4093, LIMITS)
