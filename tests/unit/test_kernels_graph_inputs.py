"""kernels.graph_inputs (the decode graphs' input fill) in the Triton interpreter: the staged
entries, the sampled ids over the first n as int32, nothing past `used`, and bad shapes refused."""

import importlib

import pytest
import torch
from triton.runtime import interpreter

from tests.unit.interpreted_kernels import kernels  # noqa: F401  (sets TRITON_INTERPRET first)


def graph_inputs():
    from nanoserve.worker.kernels import graph_inputs as module

    # imported earlier (worker.runner.cuda_graph) before TRITON_INTERPRET was set: again
    if not isinstance(module._graph_inputs_kernel, interpreter.InterpretedFunction):
        module = importlib.reload(module)
    return module.graph_inputs


@pytest.mark.parametrize("used, n", [(1, 1), (37, 5), (2500, 256), (2500, 0)])
def test_staged_entries_then_ids_over_the_first_n(used, n):
    staged = torch.arange(3000, dtype=torch.int32) * 7
    out = torch.full((3000,), -5, dtype=torch.int32)
    ids = torch.randint(0, 151936, (n,), dtype=torch.int64) if n else None
    graph_inputs()(staged, out, used, ids)
    want = torch.full((3000,), -5, dtype=torch.int32)
    want[:used] = staged[:used]
    if n:
        want[:n] = ids.int()
    assert torch.equal(out, want)


def test_bad_buffers_are_refused():
    f = graph_inputs()
    with pytest.raises(ValueError, match="int32"):
        f(torch.zeros(4, dtype=torch.int64), torch.zeros(4, dtype=torch.int32), 4)
    with pytest.raises(ValueError, match="int32"):
        f(torch.zeros(4, dtype=torch.int32), torch.zeros(4, dtype=torch.int32), 5)
    with pytest.raises(ValueError, match="ids past"):
        f(torch.zeros(4, dtype=torch.int32), torch.zeros(4, dtype=torch.int32), 2, torch.zeros(3))
