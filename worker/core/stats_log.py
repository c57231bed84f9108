"""The worker's periodic stats line, as vLLM logs it: every `interval_s` while there is work, the
engine core (worker.core.engine_core) logs running / waiting requests, KV-cache use, prompt and
generation throughput over the interval, and the prefix-cache hit rate, from its load reports.
"""

import logging
import time
from collections.abc import Callable
from typing import Any, NamedTuple

logger = logging.getLogger(__name__)


class Load(NamedTuple):
    """EngineCore.load()'s report: built by name in the core, it crosses the pipe as a msgpack array
    and every reader (stats line, GetLoad, metrics) rebuilds it with Load(*report)."""

    time: float  # time.monotonic()
    num_prompt_tokens: int  # prefilled since start
    num_generated_tokens: int  # sampled since start
    num_running: int
    num_waiting: int
    num_free_blocks: int
    num_total_blocks: int
    prefix_cache_hit_rate: float
    num_preemptions: int
    prefix_cache_queries: int  # prompt tokens looked up in the prefix cache since start
    prefix_cache_hits: int  # of which were found there

    @classmethod
    def of(cls, engine: Any) -> "Load":
        """Reads an LLMEngine's counters, scheduler and block manager (plain ints)."""
        s, bm = engine.scheduler, engine.block_manager
        return cls(
            time=time.monotonic(),
            num_prompt_tokens=engine.num_prompt_tokens_done,
            num_generated_tokens=engine.num_generated_tokens,
            num_running=len(s.running),
            num_waiting=len(s.waiting) + engine.num_compiling,  # grammars compiling: waiting too
            num_free_blocks=bm.num_free_blocks,
            num_total_blocks=bm.num_blocks,
            prefix_cache_hit_rate=bm.prefix_cache_hit_rate,
            num_preemptions=s.num_preemptions,
            prefix_cache_queries=bm.num_queried_tokens,
            prefix_cache_hits=bm.num_hit_tokens,
        )


def format_stats(start: Load, end: Load) -> str:
    """One line over the window start -> end (throughput is the window's average)."""
    elapsed = max(end.time - start.time, 1e-9)
    prompt_tps = (end.num_prompt_tokens - start.num_prompt_tokens) / elapsed
    generation_tps = (end.num_generated_tokens - start.num_generated_tokens) / elapsed
    used = end.num_total_blocks - end.num_free_blocks
    kv_usage = used / end.num_total_blocks if end.num_total_blocks else 0.0
    return (
        f"running {end.num_running}, waiting {end.num_waiting}, "
        f"KV cache {kv_usage:.1%} used, prompt {prompt_tps:.1f} tok/s, "
        f"generation {generation_tps:.1f} tok/s, prefix cache hit rate "
        f"{end.prefix_cache_hit_rate:.1%}, preemptions {end.num_preemptions}"
    )


class StatsLogger:
    """Windows of `interval_s` seconds that open when work starts; a window logs its line when it
    is interval_s old, then the next opens if work remains. Idle, nothing is logged (interval 0: off)."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.start: Load | None = None  # None: no window open (idle or off)

    def begin(self, load: Callable[[], Load]) -> None:
        """Before a step: opens a window at load() when none is open (load is called only then)."""
        if self.interval_s and self.start is None:
            self.start = load()

    def idle_wait_s(self) -> float | None:
        """How long the idle engine may block before the open window's line is due (None: none open)."""
        if self.start is None:
            return None
        return max(0.0, self.start.time + self.interval_s - time.monotonic())

    def observe(self, end: Load) -> None:
        """After a step, or idle: logs the open window's line once it is interval_s old."""
        if self.start is None:
            return
        if end.time - self.start.time < self.interval_s:
            return
        logger.info("%s", format_stats(self.start, end))
        self.start = end if end.num_running or end.num_waiting else None
