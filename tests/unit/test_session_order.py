"""Issue 32: the worker applies a SessionRequest in the order its entries were made. A message that
adds a request and aborts it (the frontend merged them under a slow write) ends the request: the
engine core gets the add and then the abort, and the session keeps nothing of it."""

import asyncio
import itertools

from nanoserve.proto.v1 import worker_service_pb2 as worker_pb2
from nanoserve.sampling import Limits
from nanoserve.worker.service.session import WorkerSession
from tests.unit.test_completion_abort import bookkeeping_engine


async def _messages(*messages: worker_pb2.SessionRequest):
    for m in messages:
        yield m


def test_an_add_and_its_abort_in_one_message_end_the_request() -> None:
    async def main() -> None:
        engine = bookkeeping_engine()
        engine.limits = Limits(max_model_len=64, vocab_size=100, eos_token_ids=(0,))
        engine.next_id = itertools.count()
        session = WorkerSession(engine, 8, check_ready=lambda: engine)
        add = worker_pb2.SessionAdd(
            request=worker_pb2.GenerateTokensRequest(request_id="B", prompt_token_ids=[1, 2, 3]),
            timeout_s=30.0,
        )
        add.request.sampling_params.max_tokens = 40
        await session.read(_messages(worker_pb2.SessionRequest(adds=[add], aborts=["B"])))
        await asyncio.sleep(0)  # AsyncEngine's flush
        assert "B" not in session.live and not session.timers  # ended, its deadline timer too
        assert not engine.streams  # the engine's stream released
        added = [a[0] for f in engine.to_core.frames for a in f[0]]
        aborted = [x for f in engine.to_core.frames for x in f[1]]
        assert added and aborted == added  # the core adds it, then aborts it (adds go first)

    asyncio.run(main())
