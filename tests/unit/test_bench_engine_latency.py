"""benchmarks.engine's batch-1 latency: the per-token figure is the difference of median run times
(interleaved repeats), so one stalled run cannot make it wrong or negative."""

from types import SimpleNamespace

from nanoserve.benchmarks import engine


class FakeLLM:
    """generate() costs 10 ms + 1 ms a token on a fake clock; the first 1-token run stalls 50 ms."""

    def __init__(self):
        self.now, self.calls = 0.0, []

    def clock(self) -> float:
        return self.now

    def generate(self, prompts, sp, use_tqdm=False):
        timed = len(self.calls) > 0  # the first call is the warm-up
        self.calls.append(sp.max_tokens)
        stall = 0.05 if timed and sp.max_tokens == 1 and self.calls.count(1) == 1 else 0.0
        self.now += 0.010 + 0.001 * sp.max_tokens + stall


def test_latency_is_the_median_difference(monkeypatch):
    llm = FakeLLM()
    monkeypatch.setattr(engine.time, "perf_counter", llm.clock)
    res = engine.bench_latency(llm, SimpleNamespace(context=16, decode_tokens=8))
    assert res == dict(context=16, ms_per_token=1.0)
    assert llm.calls == [2] + [1, 9] * engine.LATENCY_REPEATS
