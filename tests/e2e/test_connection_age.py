"""--max-connection-age-s on frontends sharing a port (--reuse-port): a client with one channel is
asked to reconnect as its connections age, so its calls spread over the processes instead of
loading the one its first connection landed on; streams in flight when their connection gets the
GOAWAY end normally, and no call fails.
"""

import re
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from nanoserve.client import Client
from tests.e2e.processes import Service, start_frontend

pytestmark = pytest.mark.e2e

AGE_S = 0.2
PEER = re.compile(r"Generate OK .* peer=ipv4:127\.0\.0\.1:(\d+)")


def served(frontend: Service) -> list[int]:
    """The client ports of the Generate calls this frontend logged as OK."""
    return [int(m[1]) for line in frontend.lines if (m := PEER.search(line))]


def test_one_channel_spreads_over_processes_and_streams_outlive_their_connection(
    services, tiny_model_dir
) -> None:
    flags = ("--reuse-port", "--max-connection-age-s", str(AGE_S))
    first = start_frontend(tiny_model_dir, services.worker.address, *flags)
    try:
        second = start_frontend(tiny_model_dir, services.worker.address, *flags, port=first.port)
        try:
            deadline = time.monotonic() + 60  # health on the shared port may reach either
            while " ready: model" not in second.output() and time.monotonic() < deadline:
                time.sleep(0.05)
            with Client(first.address, timeout=60) as client, ThreadPoolExecutor(4) as pool:

                def long_stream() -> float:
                    chunks, times = [], []
                    for chunk in client.generate_stream("hi", max_tokens=100, ignore_eos=True):
                        chunks.append(chunk)
                        times.append(time.monotonic())
                    assert chunks[-1].finish_reason == "length"
                    assert sum(len(c.token_ids) for c in chunks) == 100
                    return times[-1] - times[0]

                streams = [pool.submit(long_stream) for _ in range(4)]
                # short calls on the same channel while the streams run, and after: each ~AGE_S
                # opens a new connection, which the kernel hands to either process
                calls_until = time.monotonic() + 40 * AGE_S
                while time.monotonic() < calls_until:
                    assert client.generate("hi", max_tokens=2).finish_reason == "length"
                    time.sleep(AGE_S / 4)
                spans = [stream.result(60) for stream in streams]  # a stream's error raises here
            # each stream was open across at least one GOAWAY of its connection
            assert min(spans) > AGE_S * 1.5, spans
            ports = [served(first), served(second)]
            # ~40 connections: all on one of two processes would be a 2^-39 chance
            assert len(set(ports[0] + ports[1])) >= 10, ports
            assert ports[0] and ports[1], ports
        finally:
            assert second.stop() == 0, second.output()
    finally:
        assert first.stop() == 0, first.output()
