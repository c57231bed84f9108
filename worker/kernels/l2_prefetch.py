"""Weight prefetch into L2 for the decode step's GEMMs: the small kernel before a GEMM (the add +
RMSNorm before qkv_proj and gate_up_proj, SiLU-and-mul before down_proj) launches extra programs
that only prefetch the GEMM's weight, so its reads hit L2 instead of waiting on HBM.

Why: at decode rows (M <= 256) cuBLAS reads the 0.6B weights at 0.2-0.5 of HBM bandwidth (few tiles
in flight); the weight does not depend on the step, so it can stream while the norm runs and the
GEMM launches. The prefetch programs skip the PDL wait (nothing they read is written by the kernel
before) and end at once (prefetch.global.L2 is fire-and-forget). Off on CPU (the interpreter has
no inline asm), for prefill-sized inputs, and for weights too large to stay in L2.
"""

import functools
import os

import torch
import triton
import triton.language as tl

# bytes of weight one prefetch program covers: 512 L2 lines of 128 bytes, four a thread at 4 warps
CHUNK_BYTES = 64 << 10
LINE_BYTES = 128
# rows of the kernel's input up to which the GEMM after it is a decode GEMM (weight-read bound)
MAX_ROWS = 256
# the largest weight prefetched: a third of the H200's 50 MB L2, so the GEMM's own activations and
# the next kernels' lines do not evict what was fetched
MAX_BYTES = 16 << 20
# benchmarks.variants "noprefetch" sets it False before the graphs are captured
ENABLED = True


@functools.cache
def _supported(device_index: int) -> bool:
    if os.environ.get("TRITON_INTERPRET") == "1":
        return False
    return torch.cuda.get_device_capability(device_index)[0] >= 8


def plan(rows: int, nbytes: int) -> int:
    """The rule: prefetch programs for a kernel over `rows` input rows before a GEMM whose weight
    has `nbytes` (0: none). Shapes only, so a captured graph replays it."""
    if not ENABLED or rows > MAX_ROWS or nbytes > MAX_BYTES:
        return 0
    return triton.cdiv(nbytes, CHUNK_BYTES)


def prefetch_programs(rows: int, weight: torch.Tensor | None) -> int:
    """plan() for the next GEMM's `weight` where the prefetch can run (a contiguous CUDA tensor
    on sm_80 or later, not the interpreter); 0 for no weight."""
    if weight is None or not weight.is_cuda or not weight.is_contiguous():
        return 0
    if not _supported(weight.device.index or 0):
        return 0
    return plan(rows, weight.numel() * weight.element_size())


@triton.jit
def prefetch_chunk(w_ptr, chunk, numel, ELEMS_PER_LINE: tl.constexpr, LINES: tl.constexpr):
    """Prefetch lines [chunk * LINES, (chunk + 1) * LINES) of the flat weight w_ptr (numel
    elements) into L2; lines past the end re-fetch the last one."""
    offs = chunk.to(tl.int64) * (LINES * ELEMS_PER_LINE) + tl.arange(0, LINES) * ELEMS_PER_LINE
    offs = tl.minimum(offs, numel - 1)
    tl.inline_asm_elementwise(
        "prefetch.global.L2 [$1]; mov.u32 $0, 0;",
        "=r,l",
        [w_ptr + offs],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


def prefetch_args(weight: torch.Tensor | None, fallback: torch.Tensor, programs: int) -> dict:
    """The kernel arguments of a launch with `programs` prefetch programs: the weight (or any
    tensor when there are none), its element count, PREFETCH and the constexprs prefetch_chunk
    takes."""
    w = weight if programs and weight is not None else fallback
    return dict(
        pf_ptr=w,
        pf_numel=w.numel(),
        PREFETCH=programs > 0,
        PF_ELEMS_PER_LINE=LINE_BYTES // w.element_size(),
        PF_LINES=CHUNK_BYTES // LINE_BYTES,
    )
