"""Programmatic dependent launch (Hopper and later) for the decode step's Triton kernels: a kernel
launched with it may be scheduled while the kernel before it drains, and waits in gdc_wait (its
first instruction: nothing is read or written before the previous kernel's writes are visible).
benchmarks/pdl.py on the H200: 0.35-0.45 µs saved a kernel boundary inside a CUDA graph.
Right after the wait each program also signals that the next kernel may launch (TRIGGER): once
every program of this one has started, the next one's programs take free SM slots and wait there,
instead of launching only when this kernel has ended.

NANOSERVE_PDL=0 turns it off. Never on CPU (the Triton interpreter) or before sm_90; never for the
tensor-parallel all-reduce kernels, which spin on other ranks.
"""

import functools
import os

import torch
import triton
import triton.language as tl


@functools.cache
def _enabled(device_index: int) -> bool:
    if os.environ.get("NANOSERVE_PDL", "1") == "0" or os.environ.get("TRITON_INTERPRET") == "1":
        return False
    return torch.cuda.get_device_capability(device_index)[0] >= 9


def pdl_launch(t: torch.Tensor) -> dict:
    """Keyword arguments for a kernel launch on t's device: PDL (the kernel's constexpr: wait
    first) and launch_pdl (the launch attribute), or PDL=False alone."""
    if t.device.type != "cuda" or not _enabled(t.device.index or 0):
        return dict(PDL=False)
    return dict(PDL=True, launch_pdl=True)


# the early launch signal (benchmarks.variants "notrigger" sets it False before any kernel compiles)
TRIGGER = tl.constexpr(True)


@triton.jit
def pdl_wait(PDL: tl.constexpr):
    """Called first by a kernel launched through pdl_launch: waits until the previous kernel's
    writes are visible, then lets the next kernel launch (a no-op constexpr branch otherwise, so
    the interpreter never meets it). The next kernel's own gdc_wait still waits for all of this
    one to end: the signal moves its launch, not what it may read."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        if TRIGGER:
            tl.extra.cuda.gdc_launch_dependents()
