"""`python -m tests.e2e.health_prober ADDRESS=SERVICE ...`: probes grpc.health.v1 Check on each
address every 10 ms, each from its own thread and channel, until stdin closes; then prints one line
per address: `ADDRESS PROBES WORST_SECONDS` (a failed probe counts as infinitely slow).

A process of its own, so that the test's client work (parsing a 1M-id response) cannot hold the
prober's GIL and pass for a stalled server.
"""

import sys
import threading
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def probe(address: str, service: str, stop: threading.Event, out: list[float]) -> None:
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        request = health_pb2.HealthCheckRequest(service=service)
        stub.Check(request, timeout=10)  # connected before the measurement starts
        ready.release()
        while not stop.is_set():
            start = time.perf_counter()
            try:
                stub.Check(request, timeout=10)
                out.append(time.perf_counter() - start)
            except grpc.RpcError:
                out.append(float("inf"))
            stop.wait(0.01)


ready = threading.Semaphore(0)


def main(args: list[str]) -> None:
    stop = threading.Event()
    targets = [arg.split("=", 1) for arg in args]
    results: dict[str, list[float]] = {address: [] for address, _ in targets}
    threads = [
        threading.Thread(target=probe, args=(address, service, stop, results[address]))
        for address, service in targets
    ]
    for thread in threads:
        thread.start()
    for _ in threads:
        ready.acquire()
    print("probing", flush=True)
    sys.stdin.read()  # until the test closes our stdin
    stop.set()
    for thread in threads:
        thread.join()
    for address, latencies in results.items():
        print(address, len(latencies), max(latencies, default=float("inf")), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
