"""nanoserve.worker.kernels (Triton) imported to run on CPU by the interpreter, with what the kernel
tests share: the torch reference's tolerances, random paged caches and shuffled block tables.

TRITON_INTERPRET is read when @triton.jit decorates, so it is set before worker.kernels is imported (and the
kernel modules are reloaded if something imported them earlier without it).
"""

import importlib
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

import torch
from triton.runtime import interpreter


def _numpy2_index_shim() -> None:
    # Triton 3.6's interpreter turns a loaded scalar (a 1-element array) into a loop bound
    # with int(array),
    # which numpy >= 2.4 rejects; take the element instead. Interpreter-only: compiled kernels
    # never see this.
    original = interpreter._patch_lang_tensor
    if getattr(original, "nanoserve_shim", False):
        return

    def patched(tensor, scope) -> None:
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched.nanoserve_shim = True
    interpreter._patch_lang_tensor = patched


def _import_kernels():
    _numpy2_index_shim()
    names = [
        "nanoserve.worker.kernels.dtypes",
        "nanoserve.worker.kernels.store_kvcache",
        "nanoserve.worker.kernels.prefill_attention",
        "nanoserve.worker.kernels.qk_norm_rope",
        "nanoserve.worker.kernels.decode_merge",
        "nanoserve.worker.kernels.decode_attention",
        "nanoserve.worker.kernels.norm",
        "nanoserve.worker.kernels.split_k_gemm",
        "nanoserve.worker.kernels",
    ]
    if "nanoserve.worker.kernels.decode_attention" in sys.modules:
        decode = sys.modules["nanoserve.worker.kernels.decode_attention"]
        if not isinstance(decode._decode_split_kernel, interpreter.InterpretedFunction):
            for name in names:
                if name in sys.modules:
                    importlib.reload(sys.modules[name])
    return importlib.import_module("nanoserve.worker.kernels")


kernels = _import_kernels()


def decode_module():
    return sys.modules["nanoserve.worker.kernels.decode_attention"]


TOL = {torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float16: 5e-3}


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def make_cache(num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int, dtype, gen):
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    return (
        torch.randn(shape, generator=gen).to(dtype),
        torch.randn(shape, generator=gen).to(dtype),
    )


def make_block_tables(
    context_lens: list[int],
    block_size: int,
    num_blocks: int,
    gen,
    width: int | None = None,
    pad: int = -1,
) -> torch.Tensor:
    """Shuffled (non-contiguous) distinct blocks per sequence, padded with `pad`."""
    need = [(n + block_size - 1) // block_size for n in context_lens]
    width = width or max(max(need), 1)
    perm = torch.randperm(num_blocks, generator=gen)
    if sum(need) > num_blocks:
        raise ValueError("test cache too small")
    tables = torch.full((len(context_lens), width), pad, dtype=torch.int32)
    used = 0
    for i, n in enumerate(need):
        tables[i, :n] = perm[used : used + n].int()
        used += n
    return tables


def poison_unused(
    k_cache: torch.Tensor, v_cache: torch.Tensor, tables: torch.Tensor, context_lens: list[int]
) -> None:
    """NaN into every cache slot no sequence may read: spare blocks (block 0 included) and block tails."""
    block_size = k_cache.shape[1]
    live = torch.zeros(k_cache.shape[:2], dtype=torch.bool)
    for row, n in zip(tables.tolist(), context_lens):
        for pos in range(n):
            live[row[pos // block_size], pos % block_size] = True
    k_cache[~live] = float("nan")
    v_cache[~live] = float("nan")
