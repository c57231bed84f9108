"""The fused all-reduce + add + RMSNorm kernel's flag protocol on one GPU: two simulated ranks run
concurrently on two streams and give the exact sum over chained calls (generations advance in step);
a peer that never arrives makes the kernel write its error word and trap, instead of hanging."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

M, HIDDEN = 16, 4096


def two_ranks(dev):
    """Each simulated rank's buffer (2 slots, 2 sources, M * HIDDEN), flags, generations, error."""
    buffers = [torch.zeros(2 * 2 * M * HIDDEN, dtype=torch.bfloat16, device=dev) for _ in range(2)]
    flags = [torch.zeros(M * 2, dtype=torch.int32, device=dev) for _ in range(2)]
    gens = [torch.zeros(M, dtype=torch.int32, device=dev) for _ in range(2)]
    errors = [torch.zeros(1, dtype=torch.int32, pin_memory=True) for _ in range(2)]
    ptrs = [
        torch.tensor([t.data_ptr() for t in ts], dtype=torch.int64, device=dev)
        for ts in (buffers, flags)
    ]
    return ptrs, gens, errors


def test_two_ranks_on_two_streams_sum_exactly_over_chained_calls():
    # in its own process: a trapped kernel ends the CUDA context, which would fail every later test
    script = (
        "import json, tests.gpu.test_allreduce_norm_gpu as t\n"
        "print(json.dumps(t.two_ranks_chained_calls()))"
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"exact": [True, True], "generations": [[8] * M] * 2, "errors": [0, 0]}, result


def two_ranks_chained_calls() -> dict:
    """Eight chained calls of two simulated ranks on two streams; what each rank ended with."""
    from nanoserve.worker.kernels import fused_add_rms_norm
    from nanoserve.worker.kernels.allreduce_norm import allreduce_add_rms_norm

    dev = torch.device("cuda")
    (buffer_ptrs, flag_ptrs), gens, errors = two_ranks(dev)
    g = torch.Generator(dev).manual_seed(0)
    xs = [torch.randn(M, HIDDEN, device=dev, generator=g).bfloat16() for _ in range(2)]
    residual = torch.randn(M, HIDDEN, device=dev, generator=g).bfloat16()
    weight = torch.rand(HIDDEN, device=dev, generator=g).bfloat16() + 0.5
    streams = [torch.cuda.Stream() for _ in range(2)]
    torch.cuda.synchronize()
    outs = [None, None]
    for call in range(8):  # slots alternate; generations 1..8
        for rank in range(2):
            with torch.cuda.stream(streams[rank]):
                outs[rank] = allreduce_add_rms_norm(
                    xs[rank],
                    residual,
                    weight,
                    1e-6,
                    buffer_ptrs,
                    flag_ptrs,
                    call % 2,
                    M * HIDDEN,
                    rank,
                    gens[rank],
                    errors[rank],
                )
    try:
        torch.cuda.synchronize()
    except RuntimeError as e:  # a trapped kernel: the error words (pinned host memory) say why
        return {"raised": str(e)[:200], "errors": [e.item() for e in errors]}
    ref = fused_add_rms_norm((xs[0].float() + xs[1].float()).bfloat16(), residual, weight, 1e-6)
    return {
        "exact": [torch.equal(o[0], ref[0]) and torch.equal(o[1], ref[1]) for o in outs],
        "generations": [g.tolist() for g in gens],
        "errors": [e.item() for e in errors],
    }


TRAP = """
import json, torch
from tests.gpu.test_allreduce_norm_gpu import M, HIDDEN, two_ranks
from nanoserve.worker.kernels.allreduce_norm import allreduce_add_rms_norm
dev = torch.device("cuda")
(buffer_ptrs, flag_ptrs), gens, errors = two_ranks(dev)
x = torch.randn(M, HIDDEN, device=dev).bfloat16()
allreduce_add_rms_norm(x, x, x[0], 1e-6, buffer_ptrs, flag_ptrs, 0, M * HIDDEN, 0, gens[0],
                       errors[0], max_spins=10000)  # rank 1 never comes
try:
    torch.cuda.synchronize()
    raised = ""
except Exception as e:
    raised = str(e)
print(json.dumps({"error": int(errors[0][0]), "raised": raised}))
"""


def test_a_peer_that_never_arrives_traps_the_kernel_with_the_error_word_set():
    out = subprocess.run(
        [sys.executable, "-c", TRAP],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["error"] == 2, (result, out.stderr[-2000:])
    assert result["raised"], result  # the CUDA context ended: the rank's process fails
