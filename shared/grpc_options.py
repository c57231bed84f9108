"""gRPC server and channel options both services use: bounded message sizes, and keepalive
settings that agree, so long prefills with no DATA frames never draw a "too_many_pings" GOAWAY.
"""

DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024
# Clients ping an idle connection every 30 s and drop it after 10 s without an answer.
CLIENT_KEEPALIVE_TIME_MS = 30_000
CLIENT_KEEPALIVE_TIMEOUT_MS = 10_000
# gRPC core's default is 120 s: a client that connects and says nothing holds a socket that long
DEFAULT_HANDSHAKE_TIMEOUT_S = 10.0
# calls gRPC core may hold before the server loop takes them (its default: drops from 1,000)
MAX_PENDING_CALLS = 65_536


def server_options(
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    idle_timeout_s: float = 0.0,
    handshake_timeout_s: float = DEFAULT_HANDSHAKE_TIMEOUT_S,
    max_age_s: float = 0.0,
) -> list[tuple[str, int]]:
    """Options for grpc.aio.server(options=...). `idle_timeout_s`: a connection without a call for
    this long gets a GOAWAY and is closed (0 = never); `handshake_timeout_s`: a connection that
    has not completed its HTTP/2 (and TLS) handshake by then is closed; `max_age_s`: a connection
    this old gets a GOAWAY (its client reconnects for its next calls, those in flight finish)."""
    idle = [("grpc.max_connection_idle_ms", int(idle_timeout_s * 1000))] if idle_timeout_s else []
    # gRPC core's grace after the age's GOAWAY is unbounded by default: calls in flight finish
    age = [("grpc.max_connection_age_ms", int(max_age_s * 1000))] if max_age_s else []
    return [
        *idle,
        *age,
        ("grpc.server_handshake_timeout_ms", int(handshake_timeout_s * 1000)),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        # grpc binds with SO_REUSEPORT by default: a second server on a busy port would start and
        # silently share its connections. Refuse the port instead.
        ("grpc.so_reuseport", 0),
        # Accept the clients' 30 s pings, also between calls, and never punish them with GOAWAY.
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
        ("grpc.http2.max_ping_strikes", 0),
        # Detect dead clients (a killed frontend) so their streams are cancelled and freed.
        ("grpc.keepalive_time_ms", 60_000),
        ("grpc.keepalive_timeout_ms", 20_000),
        # A burst of calls waits in gRPC core until the asyncio server loop picks each one up;
        # past 1,000 waiting, core's random early drop ends some with a bare CANCELLED the client
        # never asked for (issue 15's 1,800-call burst). Let them all reach the handlers, whose
        # admission answers RESOURCE_EXHAUSTED ("retry later") in a few microseconds each.
        ("grpc.server.max_pending_requests", MAX_PENDING_CALLS),
        ("grpc.server.max_pending_requests_hard_limit", MAX_PENDING_CALLS),
    ]


def channel_options(max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> list[tuple[str, int]]:
    """Options for grpc.aio.insecure_channel(options=...)."""
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.keepalive_time_ms", CLIENT_KEEPALIVE_TIME_MS),
        ("grpc.keepalive_timeout_ms", CLIENT_KEEPALIVE_TIMEOUT_MS),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        # A restarted peer is found again within ~2 s instead of after exponential backoff.
        ("grpc.initial_reconnect_backoff_ms", 200),
        ("grpc.min_reconnect_backoff_ms", 200),
        ("grpc.max_reconnect_backoff_ms", 2_000),
    ]
