"""The load a worker piggybacks on its Session streams (SessionResponse.load), from AsyncEngine's
latest core frame: sent when it changed (at most every min_interval_s) and every keepalive_s
otherwise, so the frontend's router needs no GetLoad polls while a session is open.
"""

import math

from nanoserve.proto.v1 import worker_service_pb2 as worker_pb2
from nanoserve.worker.core.stats_log import Load

MIN_INTERVAL_S = 0.05  # a busy engine changes its load every step: at most 20 reports/s
KEEPALIVE_S = 1.0  # an idle worker's report stays this fresh (the frontend's staleness bound)

# (running, waiting, free blocks, total blocks, prefix-cache queries, hits, draining)
LoadKey = tuple[int, int, int, int, int, int, bool]


def load_key(load: Load, draining: bool) -> LoadKey:
    """What the router reads from a report: a report is sent again when one of these changed."""
    return (
        load.num_running,
        load.num_waiting,
        load.num_free_blocks,
        load.num_total_blocks,
        load.prefix_cache_queries,
        load.prefix_cache_hits,
        draining,
    )


def session_load(load: Load, draining: bool) -> worker_pb2.GetLoadResponse:
    """The report a SessionResponse carries: GetLoad's fields less the rates and num_finished."""
    return worker_pb2.GetLoadResponse(
        num_running=load.num_running,
        num_waiting=load.num_waiting,
        num_free_blocks=load.num_free_blocks,
        num_total_blocks=load.num_total_blocks,
        prefix_cache_hit_rate=load.prefix_cache_hit_rate,
        num_preemptions=load.num_preemptions,
        prefix_cache_queries=load.prefix_cache_queries,
        prefix_cache_hits=load.prefix_cache_hits,
        draining=draining,
    )


class LoadReporter:
    """When one session's next report is due; `now` is the event loop's clock."""

    def __init__(self, min_interval_s: float = MIN_INTERVAL_S, keepalive_s: float = KEEPALIVE_S):
        self.min_interval_s, self.keepalive_s = min_interval_s, keepalive_s
        self.sent_key: LoadKey | None = None  # None: none sent yet (the first is due at once)
        self.sent_at = -math.inf

    def wait_s(self, key: LoadKey, now: float, busy: bool) -> float:
        """How long the session may sleep before a report can be due: 0 only when one is (the
        session loops on it). A `busy` engine (others' requests running) is looked at every
        min_interval_s: this session's own outputs, that wake it every step, may be none."""
        keepalive = max(0.0, self.sent_at + self.keepalive_s - now)
        if key != self.sent_key:
            return min(keepalive, max(0.0, self.sent_at + self.min_interval_s - now))
        # unchanged: only the keep-alive makes it due; busy, the key may change meanwhile
        return min(keepalive, self.min_interval_s) if busy else keepalive

    def due(self, key: LoadKey, now: float) -> bool:
        """True (and recorded as sent) when `key` changed and min_interval_s passed since the last
        report, or keepalive_s passed."""
        # the same sums as wait_s (sent_at + interval against now): a difference (now - sent_at)
        # rounds apart, and a zero wait that is not due spins the session's loop
        if now < self.sent_at + self.min_interval_s or (
            key == self.sent_key and now < self.sent_at + self.keepalive_s
        ):
            return False
        self.sent_key, self.sent_at = key, now
        return True
