"""An OTLP/gRPC trace receiver that only counts what it is sent: the collector end of
`nanoserve bench frontend-cost --traces`, so that the services' tracing cost is measured with a
real exporter talking to a real endpoint (what the receiver costs is not counted: it runs in the
benchmark's own process)."""

import threading
from concurrent import futures

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as trace_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as trace_grpc


class SpanCounter(trace_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.spans = 0
        self._lock = threading.Lock()

    def Export(self, request, context):
        count = sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)
        with self._lock:
            self.spans += count
        return trace_pb2.ExportTraceServiceResponse()


def start_sink() -> tuple[grpc.Server, SpanCounter, str]:
    """A receiver on a free loopback port: (server to stop, its counter, its address)."""
    counter = SpanCounter()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_grpc.add_TraceServiceServicer_to_server(counter, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, counter, f"127.0.0.1:{port}"
