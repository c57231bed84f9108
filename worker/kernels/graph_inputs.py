"""The decode graphs' inputs, device to device (CudaGraphRunner.run, before each replay): the step's
int32 inputs, copied from the host on a side stream into a device staging buffer, go into the
graphs' fixed input buffer in one kernel, with the previous step's sampled ids (lookahead) over
the first n entries. A kernel rather than copies: no copy engine on the compute stream between
the sampler and the replay.
"""

import torch
import triton
import triton.language as tl

BLOCK = 1024


# the ids may be any int64 slice (a gather of the sampled ids): one specialisation whatever its
# alignment; the start-up compiles it with and without ids (runner.warmup.compile_step_kernels)
@triton.jit(do_not_specialize=["used", "n"], do_not_specialize_on_alignment=["ids_ptr"])
def _graph_inputs_kernel(
    staged_ptr, ids_ptr, out_ptr, used, n, HAS_IDS: tl.constexpr, BLOCK: tl.constexpr
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(staged_ptr + offs, mask=offs < used)
    if HAS_IDS:
        ids = tl.load(ids_ptr + offs, mask=offs < n, other=0)
        x = tl.where(offs < n, ids.to(tl.int32), x)
    tl.store(out_ptr + offs, x, mask=offs < used)


def graph_inputs(
    staged: torch.Tensor, out: torch.Tensor, used: int, ids: torch.Tensor | None = None
) -> None:
    """out[:used] = staged[:used] (int32, 1-D), then out[:n] = ids (n,) as int32 when ids is given
    (n <= used)."""
    if staged.dtype != torch.int32 or out.dtype != torch.int32 or used > min(len(staged), len(out)):
        raise ValueError("graph_inputs: int32 buffers holding `used` entries")
    n = 0 if ids is None else len(ids)
    if n > used:
        raise ValueError(f"graph_inputs: {n} ids past the {used} entries")
    if used == 0:
        return
    _graph_inputs_kernel[(triton.cdiv(used, BLOCK),)](
        staged, staged if ids is None else ids, out, used, n, HAS_IDS=ids is not None, BLOCK=BLOCK
    )
