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
    args = SimpleNamespace(
        context=16, decode_tokens=8, latency_repeats=engine.LATENCY_REPEATS, breakdown=False
    )
    res = engine.bench_latency(llm, args)
    assert res == dict(context=16, ms_per_token=1.0, ms_per_token_runs=[1.0] * 3)
    assert llm.calls == [2] + [1, 9] * engine.LATENCY_REPEATS


def test_each_repeat_s_pace_is_listed(monkeypatch):
    """A repeat at a slower pace (the third: +0.5 ms a token) shows in the runs, not the median."""
    llm = FakeLLM()
    slow = llm.generate

    def generate(prompts, sp, use_tqdm=False):
        slow(prompts, sp, use_tqdm)
        if sp.max_tokens == 9 and llm.calls.count(9) == 3:
            llm.now += 0.004  # 8 timed tokens, 0.5 ms each

    llm.generate = generate
    monkeypatch.setattr(engine.time, "perf_counter", llm.clock)
    args = SimpleNamespace(context=16, decode_tokens=8, latency_repeats=5, breakdown=False)
    res = engine.bench_latency(llm, args)
    assert res["ms_per_token"] == 1.0
    assert res["ms_per_token_runs"] == [1.0, 1.0, 1.5, 1.0, 1.0]


def test_breakdown_times_one_more_run_by_stage(monkeypatch):
    """--breakdown: one more, instrumented run; each stage's ms a call and calls a step, the
    engine's methods its own again afterwards."""

    class Stepping(FakeLLM):
        def __init__(self):
            super().__init__()
            self.scheduler = SimpleNamespace(schedule=lambda: None, postprocess=lambda: None)
            self.model_runner = SimpleNamespace(
                prepare_decode=lambda: None, prepare_sample=lambda: None, run=lambda: None
            )

        def generate(self, prompts, sp, use_tqdm=False):
            super().generate(prompts, sp, use_tqdm)
            for _ in range(sp.max_tokens):
                self.step()

        def step(self):
            self.scheduler.schedule()
            self.model_runner.run()
            self.scheduler.postprocess()

    llm = Stepping()
    monkeypatch.setattr(engine.time, "perf_counter", llm.clock)
    args = SimpleNamespace(context=16, decode_tokens=8, latency_repeats=1, breakdown=True)
    res = engine.bench_latency(llm, args)
    assert res["calls_per_step"]["run (incl. GPU)"] == 1.0
    assert set(res["ms_per_call"]) >= {"schedule", "run (incl. GPU)", "engine step"}
    assert "step" not in vars(llm) and llm.calls[-1] == 8  # the instrumented run: 8 tokens
