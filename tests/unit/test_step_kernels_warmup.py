"""runner.warmup.compile_step_kernels in the Triton interpreter: the sampler's, the seeded noise's
and the graph-input fill's kernels run with a step's dtypes and both of their constexpr branches
(the GPU test tests/gpu/test_ttft_gpu.py checks that serving then compiles nothing)."""

import importlib

import torch
from triton.runtime import interpreter

import tests.unit.interpreted_kernels  # noqa: F401  (the interpreter and its numpy shim first)

MODULES = ("sample_rows", "seeded_noise", "graph_inputs")


def interpreted(name: str):
    module = importlib.import_module(f"nanoserve.worker.kernels.{name}")
    kernel = next(v for k, v in vars(module).items() if k.startswith("_") and k.endswith("_kernel"))
    # imported before TRITON_INTERPRET was set (by worker.runner modules): again
    if not isinstance(kernel, interpreter.InterpretedFunction):
        module = importlib.reload(module)
    return module


def test_each_kernel_and_branch_runs(monkeypatch):
    from nanoserve.worker.runner import warmup

    modules = {name: interpreted(name) for name in MODULES}
    calls: list[tuple] = []

    def recorded(module, name, describe):
        real = getattr(module, name)

        def wrapper(*args, **kwargs):
            calls.append((name, describe(*args)))
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, wrapper)

    recorded(modules["sample_rows"], "sample_rows", lambda x, t, *g: (x.dtype, t is None))
    recorded(modules["seeded_noise"], "fill_seeded_exponential", lambda n, r, s, p: n.dtype)
    recorded(
        modules["graph_inputs"], "graph_inputs", lambda s, o, u, ids=None: ids is None or ids.dtype
    )
    warmup.compile_step_kernels(300, torch.bfloat16, torch.device("cpu"))
    assert calls == [
        ("sample_rows", (torch.bfloat16, True)),  # ALL_GREEDY
        ("sample_rows", (torch.bfloat16, False)),  # with temperatures
        ("fill_seeded_exponential", torch.float32),
        ("graph_inputs", True),  # HAS_IDS off
        ("graph_inputs", torch.int64),  # the sampled ids of lookahead
    ]
