"""benchmarks.engine's step breakdown: its timers count the engine's stages and the waits for the
GPU, and restore() gives every class and instance its own methods back."""

import types

import torch

from nanoserve.benchmarks.engine import calls_per_step, report_breakdown, restore, step_breakdown


class FakeRunner:
    def prepare_decode(self, seqs):
        return seqs

    def prepare_sample(self, seqs):
        return seqs

    def run(self, seqs):
        return torch.tensor([1, 2]).tolist()


class FakeScheduler:
    def schedule(self):
        return []

    def postprocess(self, *a):
        return None


def test_timers_count_and_restore_puts_everything_back() -> None:
    runner, scheduler = FakeRunner(), FakeScheduler()
    llm = types.SimpleNamespace(model_runner=runner, scheduler=scheduler)
    llm.step = lambda: (scheduler.schedule(), runner.run([]), scheduler.postprocess())
    tolist, sync = torch.Tensor.tolist, torch.cuda.Event.synchronize
    replay = torch.cuda.CUDAGraph.replay
    b = step_breakdown(llm, gpu_waits=True)
    for _ in range(3):
        llm.step()
    restore(b)
    assert calls_per_step(b)["wait: tensor tolist"] == 1.0  # one a step
    assert b["counts"]["run (incl. GPU)"] == 3 and b["counts"]["wait: tensor tolist"] == 3
    assert set(report_breakdown(b)) == set(b["totals"])
    assert torch.Tensor.tolist is tolist and torch.cuda.Event.synchronize is sync
    assert torch.cuda.CUDAGraph.replay is replay
    assert "run" not in vars(runner) and "schedule" not in vars(scheduler)
    assert isinstance(llm.step, types.LambdaType) and llm.step.__name__ == "<lambda>"  # its own
