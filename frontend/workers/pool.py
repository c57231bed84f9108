"""The frontend's set of workers: `--worker-address` (addresses, or DNS names that resolve to many)
re-resolved every few seconds into one WorkerLink per address, the model every worker must match,
and the pool's health; RequestRunner (frontend.request) asks it for the worker of each request
(frontend.workers.routing).
"""

import asyncio
import contextlib
import functools
import ipaddress
import logging
import socket
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import grpc

from nanoserve.errors import FailedPrecondition, Unavailable
from nanoserve.frontend.config import parse_worker_address
from nanoserve.frontend.workers.link import LinkState, ModelInfo, WorkerLink, within
from nanoserve.frontend.workers.routing import BalanceRule, choose, prefix_key
from nanoserve.security import bearer_metadata

logger = logging.getLogger(__name__)

DEFAULT_RESOLVE_INTERVAL_S = 5.0
# What every worker must report alike: requests are validated against one worker's limits and
# detokenized with the frontend's tokenizer, then run on any of them.
MATCHED_FIELDS = ("model_name", "tokenizer_digest", "vocab_size", "max_model_len", "eos_token_ids")


def _plain(value: object) -> object:
    """A proto repeated field as a list (they compare by identity with each other)."""
    return value if isinstance(value, str | int) else list(value)  # type: ignore[call-overload]


def format_address(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


async def resolve(host: str, port: int) -> set[str]:
    """The addresses `host` names now, as channel targets. Through the system resolver
    (getaddrinfo: /etc/hosts, DNS, what compose and Kubernetes set up), because grpcio's Python API
    has no custom load-balancing policy: choosing the worker per request takes one channel per
    worker, so the frontend must know each address itself rather than leave it to a channel's
    resolver. A name with IPv4 addresses yields only those (`localhost` is also ::1, where a
    worker bound to 127.0.0.1 never answers; a dual-stack pod would count twice)."""
    with contextlib.suppress(ValueError):
        return {format_address(str(ipaddress.ip_address(host)), port)}
    infos = await asyncio.get_running_loop().getaddrinfo(
        host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
    )
    v4 = {format_address(str(i[4][0]), port) for i in infos if i[0] == socket.AF_INET}
    return v4 or {format_address(str(i[4][0]), port) for i in infos}


class WorkerPool:
    """`on_serving_change(serving)` is awaited when the pool goes from no usable worker to some,
    or back: the frontend's health follows it."""

    def __init__(
        self,
        worker_address: str,
        tokenizer_digest: str,
        on_serving_change: Callable[[bool], Coroutine[Any, Any, None]],
        *,
        connect_timeout_s: float = 1.0,
        max_message_bytes: int = 16 * 1024 * 1024,
        resolve_interval_s: float = DEFAULT_RESOLVE_INTERVAL_S,
        poll_interval_s: float = 0.25,
        prefix_tokens: int = 256,
        rule: BalanceRule | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        token: str | None = None,
    ) -> None:
        """`token`: the worker link's secret, sent with every worker call."""
        self.targets = parse_worker_address(worker_address)
        self._digest = tokenizer_digest
        self._on_serving_change = on_serving_change
        self._new_link = functools.partial(
            WorkerLink,
            vet=self._vet,
            on_change=self._on_link_change,
            connect_timeout_s=connect_timeout_s,
            max_message_bytes=max_message_bytes,
            poll_interval_s=poll_interval_s,
            credentials=credentials,
            metadata=bearer_metadata(token),
        )
        self._resolve_interval_s = resolve_interval_s
        self.prefix_tokens = prefix_tokens
        self.rule = rule or BalanceRule()
        self.links: dict[str, WorkerLink] = {}
        self.retired: list[WorkerLink] = []  # gone from DNS, closed once their requests ended
        self.resolved: dict[tuple[str, int], set[str]] = {}  # the last answer per target
        self._host_of: dict[str, str] = {}  # address -> the name it was found under (TLS checks it)
        self._unresolvable: set[tuple[str, int]] = set()  # targets whose last lookup failed
        self.reference: ModelInfo | None = None  # what every worker must match (the first's)
        self.serving = False
        self._discovered = False  # the first lookup's links exist
        self._changed: asyncio.Future[None] | None = None  # wait_serving's, woken at each change
        self._health_tasks: set[asyncio.Task[None]] = set()
        self._discoverer: asyncio.Task | None = None

    def start(self) -> None:
        self._discoverer = asyncio.create_task(self._discover(), name="worker-discovery")

    async def close(self) -> None:
        if self._discoverer is not None:
            self._discoverer.cancel()
            await asyncio.gather(self._discoverer, return_exceptions=True)
        links = [*self.links.values(), *self.retired]
        self.links, self.retired = {}, []
        await asyncio.gather(*(link.close() for link in links))
        await asyncio.gather(*self._health_tasks, return_exceptions=True)

    # ---- what requests ask of the pool ----

    def model_info(self) -> ModelInfo:
        """The workers' common model info; UNAVAILABLE while no worker takes requests
        (FAILED_PRECONDITION when every worker that answered was refused)."""
        if self.serving and self.reference is not None:
            return self.reference
        refused = [link for link in self.links.values() if link.state is LinkState.REFUSED]
        if refused and len(refused) == len(self.links):
            raise FailedPrecondition(refused[0].reason)
        states = ", ".join(f"{a} {link.state.value}" for a, link in sorted(self.links.items()))
        raise Unavailable(f"no worker takes requests ({states or 'none resolved'})")

    async def wait_serving(self, timeout_s: float) -> None:
        """Waits up to timeout_s while no worker takes requests but one has not answered yet (this
        frontend just started, or a worker was just found): a call that reaches a fresh process
        first (a client's new connection, in a rolling restart) is served, not refused. Returns
        at once once a worker serves, or when every worker has answered (model_info says why)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not self.serving and self._connecting():
            left = deadline - loop.time()
            if left <= 0:
                return
            if self._changed is None:
                self._changed = loop.create_future()
            # shielded: a waiter's timeout must not cancel the future the others wait on
            await within(asyncio.shield(self._changed), left)

    def _connecting(self) -> bool:
        return not self._discovered or any(
            link.state is LinkState.CONNECTING for link in self.links.values()
        )

    def _wake(self) -> None:
        if self._changed is not None:
            if not self._changed.done():
                self._changed.set_result(None)
            self._changed = None

    def choose(self, prompt_ids: Sequence[int], exclude: Sequence[WorkerLink] = ()) -> WorkerLink:
        """The worker for a prompt (frontend.workers.routing.choose over the usable workers)."""
        usable = {a: link for a, link in self.links.items() if link.usable and link not in exclude}
        if not usable:
            self.model_info()  # raises why
            raise Unavailable("no other worker takes requests")
        info = self.model_info()
        key = prefix_key(prompt_ids, info.kvcache_block_size, self.prefix_tokens)
        address = choose(key, {a: link.load for a, link in usable.items()}, self.rule)
        return usable[address]

    # ---- keeping the set and its state ----

    def _vet(self, info: ModelInfo) -> str | None:
        """Why a worker's model info is refused, or None."""
        if info.tokenizer_digest and info.tokenizer_digest != self._digest:
            return (
                f"the worker's tokenizer (digest {info.tokenizer_digest[:12]}) differs from "
                f"the frontend's ({self._digest[:12]}): its tokenizer files are not the same"
            )
        ref = self.reference
        if ref is None or not any(link.info is not None for link in self.links.values()):
            self.reference = info  # the first worker accepted, while any accepted one is around
            return None
        for name in MATCHED_FIELDS:
            theirs, ours = _plain(getattr(info, name)), _plain(getattr(ref, name))
            if theirs != ours:
                return (
                    f"its {name} ({theirs!r}) differs from the other workers' ({ours!r}): "
                    "all workers must serve the same model"
                )
        return None

    def _on_link_change(self, link: WorkerLink) -> None:
        self._wake()
        serving = any(link.usable for link in self.links.values())
        if serving != self.serving:
            self.serving = serving
            if not serving:
                logger.warning("no worker takes requests: the frontend is NOT_SERVING")
            task = asyncio.create_task(self._on_serving_change(serving))
            self._health_tasks.add(task)
            task.add_done_callback(self._health_tasks.discard)

    async def _resolve_all(self) -> set[str]:
        addresses: set[str] = set()
        for target in self.targets:
            try:
                found = await resolve(*target)
            except OSError as e:  # keep the last answer: a DNS hiccup must not drop workers
                if target not in self._unresolvable:  # logged once, until it resolves again
                    self._unresolvable.add(target)
                    logger.warning("cannot resolve worker host %s: %s", target[0], e)
                found = self.resolved.get(target, set())
            else:
                self._unresolvable.discard(target)
                if target in self.resolved and found != self.resolved[target]:
                    logger.info("worker host %s now resolves to %s", target[0], sorted(found))
            self.resolved[target] = found
            self._host_of.update(dict.fromkeys(found, target[0]))
            addresses |= found
        return addresses

    async def _update(self, addresses: set[str]) -> None:
        for address in sorted(addresses - self.links.keys()):
            link = self._new_link(address, server_name=self._host_of.get(address))
            self.links[address] = link
            link.start()
        if not self._discovered:
            self._discovered = True
            self._wake()
        for address in sorted(self.links.keys() - addresses):
            link = self.links.pop(address)
            logger.info("worker at %s left the resolved set: it gets no new requests", address)
            self.retired.append(link)
            self._on_link_change(link)
        for link in [link for link in self.retired if not link.session.pending]:
            self.retired.remove(link)
            await link.close()

    async def _discover(self) -> None:
        while True:
            await self._update(await self._resolve_all())
            await asyncio.sleep(self._resolve_interval_s)
