"""WorkerService.Session on the real worker: several requests share one stream and one response
carries several of them; bad adds end with INVALID_ARGUMENT naming the field while the others run;
an abort, a timeout_s and the end of the stream each free the requests' KV blocks. Two frontends
(each with its own session) share one port with --reuse-port.
"""

import queue
import threading
import time
from collections.abc import Iterator

import grpc
import pytest

from nanoserve.client import Client
from nanoserve.proto.v1 import common_pb2
from nanoserve.proto.v1 import worker_service_pb2 as worker_pb2
from nanoserve.proto.v1 import worker_service_pb2_grpc as worker_grpc
from tests.e2e.bad_inputs_requests import WORKER_CASES
from tests.e2e.processes import assert_idle, get_load, start_frontend

pytestmark = pytest.mark.e2e

INVALID_CASES = [c for c in WORKER_CASES if c[2] == grpc.StatusCode.INVALID_ARGUMENT]


class Session:
    """A Session call driven from a test: `send` queues a SessionRequest, `outputs` collects."""

    def __init__(self, stub: worker_grpc.WorkerServiceStub, timeout: float = 60) -> None:
        self.requests: queue.Queue = queue.Queue()
        self.call = stub.Session(iter(self.requests.get, None), timeout=timeout)
        self.responses: list[worker_pb2.SessionResponse] = []

    def send(self, adds=(), aborts=()) -> None:
        self.requests.put(worker_pb2.SessionRequest(adds=list(adds), aborts=list(aborts)))

    def read_until(self, done) -> dict[str, list[worker_pb2.SessionOutput]]:
        """Reads responses until done(outputs by request id) holds."""
        by_id: dict[str, list] = {}
        for response in self.responses:
            for out in response.outputs:
                by_id.setdefault(out.request_id, []).append(out)
        while not done(by_id):
            response = next(self.call)
            self.responses.append(response)
            for out in response.outputs:
                by_id.setdefault(out.request_id, []).append(out)
        return by_id

    def close(self) -> None:
        self.requests.put(None)


def add(
    request_id: str, ids: list[int], timeout_s: float = 0.0, **sampling
) -> worker_pb2.SessionAdd:
    request = worker_pb2.GenerateTokensRequest(
        request_id=request_id,
        prompt_token_ids=ids,
        sampling_params=common_pb2.SamplingParams(**sampling),
    )
    return worker_pb2.SessionAdd(request=request, timeout_s=timeout_s)


def ended(out: worker_pb2.SessionOutput) -> bool:
    return out.finish_reason != common_pb2.FINISH_REASON_UNSPECIFIED or out.error_code != 0


@pytest.fixture(scope="module")
def stub(services) -> Iterator[worker_grpc.WorkerServiceStub]:
    with grpc.insecure_channel(services.worker.address) as channel:
        yield worker_grpc.WorkerServiceStub(channel)


def test_several_requests_share_one_stream_and_its_messages(services, stub, reference) -> None:
    prompts = {f"r{i}": [5 + i, 6, 7] for i in range(4)}
    session = Session(stub)
    session.send(adds=[add(rid, ids, max_tokens=6, temperature=0) for rid, ids in prompts.items()])
    outputs = session.read_until(
        lambda by_id: len(by_id) == 4 and all(ended(outs[-1]) for outs in by_id.values())
    )
    session.close()
    want = reference(list(prompts.values()), max_tokens=6, temperature=0)
    for (rid, _), ids in zip(prompts.items(), want, strict=True):
        got = [t for out in outputs[rid] for t in out.token_ids]
        assert got == ids, rid
        last = outputs[rid][-1]
        assert last.finish_reason == common_pb2.FINISH_REASON_LENGTH
        assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (3, 6)
    # the requests decode in one batch: one message per step carries all of them (messages with
    # only the worker's load report are not counted)
    with_outputs = [r for r in session.responses if r.outputs]
    assert max(len(r.outputs) for r in with_outputs) == 4
    assert len(with_outputs) < sum(len(outs) for outs in outputs.values())
    assert any(r.HasField("load") for r in session.responses)  # the first is sent at once
    assert_idle(services.worker.address)


def test_bad_adds_name_the_field_and_the_good_one_runs(services, stub) -> None:
    session = Session(stub)
    bad = []
    for i, (_, case, _, field) in enumerate(INVALID_CASES):
        request = case() if callable(case) else case
        request.request_id = f"bad{i}"
        bad.append((request.request_id, field))
        session.send(adds=[worker_pb2.SessionAdd(request=request)])
    session.send(adds=[add("", [1]), add("good", [1, 2], max_tokens=2)])
    outputs = session.read_until(
        lambda by_id: len(by_id) == len(bad) + 2 and ended(by_id["good"][-1])
    )
    session.close()
    for request_id, field in bad:
        (out,) = outputs[request_id]
        assert out.error_code == grpc.StatusCode.INVALID_ARGUMENT.value[0], out
        assert field in out.error_message, out
    assert outputs[""][0].error_code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "request_id" in outputs[""][0].error_message
    assert outputs["good"][-1].finish_reason == common_pb2.FINISH_REASON_LENGTH
    assert_idle(services.worker.address)


def test_abort_and_timeout_free_the_blocks(services, stub) -> None:
    session = Session(stub)
    session.send(
        adds=[
            add("aborted", [1, 2, 3], max_tokens=3000, ignore_eos=True),
            add("timed", [4, 5, 6], timeout_s=1.0, max_tokens=3000, ignore_eos=True),
        ]
    )
    session.read_until(lambda by_id: "aborted" in by_id)  # running, holding blocks
    assert get_load(services.worker.address).num_free_blocks < 512
    session.send(aborts=["aborted"])
    start = time.monotonic()
    outputs = session.read_until(
        lambda by_id: ended(by_id.get("timed", [None])[-1] or worker_pb2.SessionOutput())
    )
    assert 0.5 < time.monotonic() - start < 10
    assert outputs["timed"][-1].error_code == grpc.StatusCode.DEADLINE_EXCEEDED.value[0]
    assert not any(ended(out) for out in outputs["aborted"])  # an abort gets no further output
    assert_idle(services.worker.address)
    session.close()


def test_the_end_of_the_stream_aborts_its_requests(services, stub) -> None:
    session = Session(stub)
    session.send(
        adds=[add(f"left{i}", [1, 2, 3 + i], max_tokens=3000, ignore_eos=True) for i in range(3)]
    )
    session.read_until(lambda by_id: len(by_id) == 3)
    assert get_load(services.worker.address).num_running == 3
    threading.Thread(target=session.call.cancel).start()  # the frontend goes away
    assert_idle(services.worker.address)


def test_two_frontends_share_a_port_with_reuse_port(services, tiny_model_dir) -> None:
    """--reuse-port: a second frontend binds the first one's port; each has its own session."""
    first = start_frontend(tiny_model_dir, services.worker.address, "--reuse-port")
    try:
        second = start_frontend(
            tiny_model_dir, services.worker.address, "--reuse-port", port=first.port
        )
        try:
            assert second.port == first.port
            # health checks on the shared port may reach either: wait for the second's own word
            deadline = time.monotonic() + 60
            while " ready: model" not in second.output() and time.monotonic() < deadline:
                time.sleep(0.05)
            for frontend in (first, second):
                with Client(frontend.address, timeout=30) as client:
                    assert client.generate("hi", max_tokens=2).finish_reason == "length"
        finally:
            second.stop()
    finally:
        first.stop()


def test_lists_past_their_bound_are_refused_naming_the_field(services, stub) -> None:
    """A batch longer than any frontend sends (4 x max_queued_requests + 1024, 4096 queued by
    default) ends the session with INVALID_ARGUMENT before any entry is walked; operator Abort
    takes at most max_queued_requests ids. The worker serves the next call as before."""
    for name in ("aborts", "completion_aborts"):
        session = Session(stub)
        if name == "aborts":
            session.send(aborts=[str(i) for i in range(4 * 4096 + 1025)])
        else:
            too_many = [worker_pb2.CompletionAbort(request_id="r", index=1)] * (4 * 4096 + 1025)
            session.requests.put(worker_pb2.SessionRequest(completion_aborts=too_many))
        with pytest.raises(grpc.RpcError) as e:
            session.read_until(lambda by_id: False)
        session.close()
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert name in e.value.details()
    with pytest.raises(grpc.RpcError) as e:
        stub.Abort(worker_pb2.AbortRequest(request_ids=["x"] * 4097), timeout=30)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "request_ids" in e.value.details()
    assert stub.Abort(worker_pb2.AbortRequest(request_ids=["x"]), timeout=30).num_aborted == 0
    assert_idle(services.worker.address)
