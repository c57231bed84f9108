"""Transport security and caller authentication of a grpc.aio server, and the matching channel
credentials: TLS (mutual when a client CA is given), and bearer-token auth checked in constant time.

ServerSecurity is built from a service's config; it gives the server's interceptors and binds its
port.
grpc.health.v1 stays open, so probes need no token.
"""

import contextvars
import hashlib
import hmac
import ipaddress
import logging
import os
import secrets
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from nanoserve.request_decoding import DecodeErrorInterceptor

logger = logging.getLogger(__name__)

PemSource = str | os.PathLike | bytes
# Methods any caller may use without a token: liveness and readiness probes.
OPEN_METHOD_PREFIXES = ("/grpc.health.v1.Health/",)
_BEARER = "bearer "
# The tenant of the call being served (set by BearerTokenInterceptor; None without auth).
_tenant: contextvars.ContextVar[str | None] = contextvars.ContextVar("tenant", default=None)


def current_tenant() -> str | None:
    """The authenticated caller of the call being served: the name its key was given in the keys
    file, or a digest of the key; None when the server checks no tokens. Never from the request."""
    return _tenant.get()


# The key of the tenants' cache salts: a salt that is a plain function of a tenant's name lets anyone
# who reaches a worker probe that tenant's prompts through the prefix cache (issue 32). Until a
# frontend sets one (--cache-salt-key-file, else its worker token), a random key of this process.
_salt_key: list[bytes] = [secrets.token_bytes(32)]


def set_cache_salt_key(key: str | bytes | None) -> None:
    """The HMAC key of tenant_cache_salt; None keeps this process's random one (prefix hits are
    then not shared with other frontends of the same workers)."""
    if key is None:
        logger.info(
            "tenant cache salts use a random key of this process (set --cache-salt-key-file for "
            "frontends that share workers to share prefix hits)"
        )
        return
    _salt_key[0] = key.encode("utf-8") if isinstance(key, str) else key


def tenant_cache_salt() -> str:
    """The prefix-cache salt of the call being served: HMAC-SHA256 of its authenticated tenant
    under the server's key (64 hex characters), so tenants never share cached blocks and nobody
    without the key can derive a tenant's salt; "" (the shared cache) without auth."""
    tenant = _tenant.get()
    if tenant is None:
        return ""
    return hmac.new(_salt_key[0], tenant.encode("utf-8"), hashlib.sha256).hexdigest()


def read_secret(path: str | None) -> str | None:
    """The first key of a keys file (load_api_keys' format: the worker reads the same file);
    None without a path."""
    if not path:
        return None
    keys = load_api_keys(path)
    if not keys:
        raise ValueError(f"{path}: no secret in it")
    return next(iter(keys)).decode("utf-8")


def read_pem(source: PemSource | None) -> bytes | None:
    """PEM bytes from a path (or the bytes themselves)."""
    if source is None or isinstance(source, bytes):
        return source
    return Path(source).read_bytes()


def load_api_keys(keys_file: str | None = None, keys: str | None = None) -> dict[bytes, str]:
    """Keys -> tenant names. `keys_file` holds one key a line, `KEY` or `TENANT KEY` ('#' starts a
    comment); `keys` is a comma-separated list (meant for an environment variable). A key without
    a name gets the first 12 hex digits of its SHA-256 as its tenant."""
    entries: list[tuple[str | None, str]] = []
    if keys_file:
        for line in Path(keys_file).read_text(encoding="utf-8").splitlines():
            words = line.split("#", 1)[0].split()
            if len(words) == 1:
                entries.append((None, words[0]))
            elif len(words) == 2:
                entries.append((words[0], words[1]))
            elif words:
                raise ValueError(
                    f"{keys_file}: expected `KEY` or `TENANT KEY`, got {len(words)} words"
                )
    if keys:
        entries.extend((None, k.strip()) for k in keys.split(",") if k.strip())
    table: dict[bytes, str] = {}
    for name, key in entries:
        raw = key.encode("utf-8")
        table[raw] = name or hashlib.sha256(raw).hexdigest()[:12]
    return table


def _deny(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    """A handler of the same shape as `handler` that answers UNAUTHENTICATED without reading the
    request (request_deserializer None: an unauthenticated caller's bytes are never parsed)."""

    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    async def stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)
        yield  # pragma: no cover - makes this an async generator

    serializer = handler.response_serializer
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(stream, response_serializer=serializer)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(unary, response_serializer=serializer)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(stream, response_serializer=serializer)
    return grpc.unary_unary_rpc_method_handler(unary, response_serializer=serializer)


class BearerTokenInterceptor(grpc.aio.ServerInterceptor):
    """Refuses calls without `authorization: Bearer <key>` metadata naming a known key
    (UNAUTHENTICATED); health is open. Every key is compared, in constant time, on every call."""

    def __init__(self, keys: dict[bytes, str]) -> None:
        if not keys:
            raise ValueError("BearerTokenInterceptor needs at least one key")
        self._keys = list(keys.items())

    def tenant_of(self, metadata: Sequence[tuple[str, Any]] | None) -> str | None:
        value = next((v for k, v in metadata or () if k == "authorization"), None)
        if isinstance(value, bytes):
            value = value.decode("utf-8", errors="replace")
        if not isinstance(value, str) or value[: len(_BEARER)].lower() != _BEARER:
            return None
        token = value[len(_BEARER) :].strip().encode("utf-8")
        tenant = None
        for key, name in self._keys:  # no early exit: the time taken says nothing about the keys
            if hmac.compare_digest(token, key):
                tenant = name
        return tenant

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or handler_call_details.method.startswith(OPEN_METHOD_PREFIXES):
            return handler
        tenant = self.tenant_of(handler_call_details.invocation_metadata)
        if tenant is None:
            return _deny(handler, "missing or unknown bearer token (metadata `authorization`)")
        _tenant.set(tenant)  # the handler runs in this context
        return handler


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name other than localhost may resolve to anything


@dataclass
class ServerSecurity:
    """What a service's config asks for: TLS files and API keys (none of them: plaintext, open)."""

    cert_file: str | None = None
    key_file: str | None = None
    client_ca_file: str | None = None  # set: clients must present a certificate it signed (mTLS)
    api_keys: dict[bytes, str] = field(default_factory=dict)

    @classmethod
    def load(
        cls,
        cert_file: str | None = None,
        key_file: str | None = None,
        client_ca_file: str | None = None,
        api_keys_file: str | None = None,
        api_keys: str | None = None,
    ) -> "ServerSecurity":
        if (cert_file is None) != (key_file is None):
            raise ValueError("tls_cert_file and tls_key_file go together")
        if client_ca_file is not None and cert_file is None:
            raise ValueError("tls_client_ca_file needs tls_cert_file and tls_key_file")
        return cls(cert_file, key_file, client_ca_file, load_api_keys(api_keys_file, api_keys))

    @property
    def tls(self) -> bool:
        return self.cert_file is not None

    def interceptors(
        self, max_request_bytes: int | None = None, hint: str = ""
    ) -> list[grpc.aio.ServerInterceptor]:
        """Outermost first: the token check, then the request-decoding guard (see
        DecodeErrorInterceptor for `max_request_bytes` and `hint`)."""
        chain: list[grpc.aio.ServerInterceptor] = []
        if self.api_keys:
            chain.append(BearerTokenInterceptor(self.api_keys))
        chain.append(DecodeErrorInterceptor(max_request_bytes, hint))
        return chain

    def credentials(self) -> grpc.ServerCredentials | None:
        if not self.tls:
            return None
        client_ca = read_pem(self.client_ca_file)
        return grpc.ssl_server_credentials(
            [(read_pem(self.key_file), read_pem(self.cert_file))],
            root_certificates=client_ca,
            require_client_auth=client_ca is not None,
        )

    def add_port(self, server: grpc.aio.Server, host: str, port: int) -> int:
        """Binds host:port (TLS when configured); returns the bound port, 0 when it failed.
        Warns when a non-loopback address is served in plaintext."""
        address = f"[{host}]" if ":" in host and not host.startswith("[") else host
        credentials = self.credentials()
        if credentials is None:
            if not is_loopback(host):
                logger.warning(
                    "serving %s in plaintext: set tls_cert_file and tls_key_file "
                    "before exposing this port",
                    host,
                )
            return server.add_insecure_port(f"{address}:{port}")
        return server.add_secure_port(f"{address}:{port}", credentials)


def channel_credentials(
    root_certificates: PemSource | bool | None = None,
    client_cert: PemSource | None = None,
    client_key: PemSource | None = None,
) -> grpc.ChannelCredentials | None:
    """TLS channel credentials, None (plaintext) when no argument is given. root_certificates:
    a PEM path or bytes, or True for the system's roots; client cert and key for mutual TLS."""
    if root_certificates is None and client_cert is None and client_key is None:
        return None
    if (client_cert is None) != (client_key is None):
        raise ValueError("client_cert and client_key go together")
    roots = None if isinstance(root_certificates, bool) else root_certificates
    return grpc.ssl_channel_credentials(
        root_certificates=read_pem(roots),
        private_key=read_pem(client_key),
        certificate_chain=read_pem(client_cert),
    )


def bearer_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """Call metadata carrying `token` (empty without one)."""
    return (("authorization", f"Bearer {token}"),) if token else ()
