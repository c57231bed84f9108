"""Bounds of the gRPC API that both sides of a hop share: the gateway checks its callers' request
ids against them, the frontend its clients' requests, the worker its frontends'."""

from nanoserve.proto.v1 import common_pb2

# a FinishReason's name: OpenAI's and vLLM's, the engine's (worker.sequence.FinishReason)
FINISH_REASONS = {
    common_pb2.FINISH_REASON_STOP: "stop",
    common_pb2.FINISH_REASON_LENGTH: "length",
    common_pb2.FINISH_REASON_TOOL_CALLS: "tool_calls",
}
FINISH_REASON_OF = {name: code for code, name in FINISH_REASONS.items()}

MAX_REQUEST_ID_LENGTH = 128  # a client's request_id (Generate, Chat, the gateway's X-Request-Id)
# a worker request's id: the frontend adds "#<its tag>-<counter>" to the client's
MAX_WORKER_REQUEST_ID_LENGTH = 2 * MAX_REQUEST_ID_LENGTH
# GenerateRequest/ChatRequest.stream_interval: tokens a response message may wait for (the
# frontend refuses more; the gateway asks for it when the caller wants the whole reply)
MAX_STREAM_INTERVAL = 256
