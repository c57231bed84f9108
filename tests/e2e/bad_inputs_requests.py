"""Raw gRPC requests for the bad-input e2e tests: the model's limits, a worker request and the
invalid ones (WORKER_CASES), channel options that send past the servers' receive limit, and the
status a response stream ended with."""

import math

import grpc

from nanoserve.proto.v1 import common_pb2
from nanoserve.proto.v1 import worker_service_pb2 as worker_pb2

VOCAB = 151936
MAX_MODEL_LEN = 4096
MiB = 1024 * 1024
SP = common_pb2.SamplingParams
INVALID = grpc.StatusCode.INVALID_ARGUMENT


def worker_request(ids: list[int], request_id: str = "", **sampling):
    return worker_pb2.GenerateTokensRequest(
        request_id=request_id, prompt_token_ids=ids, sampling_params=SP(**sampling)
    )


WORKER_CASES = [
    ("empty prompt", worker_request([]), INVALID, "prompt_token_ids"),
    ("id = vocab", worker_request([1, VOCAB]), INVALID, "prompt_token_ids"),
    ("id uint32 max", worker_request([2**32 - 1]), INVALID, "prompt_token_ids"),
    ("prompt = max_model_len", worker_request([1] * MAX_MODEL_LEN), INVALID, "prompt_token_ids"),
    (
        "prompt past max_model_len",
        lambda: worker_request([1] * 10_000),
        INVALID,
        "prompt_token_ids",
    ),
    (
        "max_tokens past the context",
        worker_request([1] * 4000, max_tokens=100),
        INVALID,
        "max_tokens",
    ),
    ("max_tokens 0", worker_request([1], max_tokens=0), INVALID, "max_tokens"),
    ("nan temperature", worker_request([1], temperature=math.nan), INVALID, "temperature"),
    (
        "inf repetition_penalty",
        worker_request([1], repetition_penalty=math.inf),
        INVALID,
        "repetition_penalty",
    ),
    ("top_p 0", worker_request([1], top_p=0.0), INVALID, "top_p"),
    ("negative top_k", worker_request([1], top_k=-5), INVALID, "top_k"),
    (
        "min_tokens > max_tokens",
        worker_request([1], max_tokens=2, min_tokens=3),
        INVALID,
        "min_tokens",
    ),
    (
        "stop token id = vocab",
        worker_request([1], stop_token_ids=[VOCAB]),
        INVALID,
        "stop_token_ids",
    ),
    (
        "message over 16 MiB",
        lambda: worker_request([VOCAB - 1] * (6 * MiB)),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "larger than max",
    ),
]


# raw channels that can send past the servers' receive limit, to see what the servers do
UNLIMITED = [("grpc.max_send_message_length", -1)]


def status_of(call) -> tuple[grpc.StatusCode, str, int]:
    """Consumes a response stream: (code, details, messages received before it ended)."""
    received = 0
    try:
        for _ in call:
            received += 1
    except grpc.RpcError as e:
        return e.code(), e.details() or "", received
    return grpc.StatusCode.OK, "", received
