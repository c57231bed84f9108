"""Linear layers split across tensor-parallel ranks (column: output rows; row: input columns).

Each parameter carries weight_loader(param, loaded_weight, shard_id=None), called by worker.model.loader
with the FULL checkpoint tensor or a lazy safetensors slice: it checks the full shape and reads only
this rank's shard, so no rank ever holds the whole weight.
"""

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from nanoserve.worker.layers.distributed import all_reduce, get_tp_rank, get_tp_world_size

# widest output that linear() sends to the skinny kernel at M = 1. L2-cold on the H200
# (nanoserve.benchmarks.gemm, docs/benchmarks.md) it beats cuBLAS up to 6144 x 4096 (qkv, o_proj,
# down_proj of 0.6B and 8B, at tp 1 and 2: 0.27-0.97x the time); cuBLAS is as fast or faster for
# gate_up at 12288 or 24576 x 4096 and the LM heads
SKINNY_MAX_N = 8192
SPLIT_K_MAX_M = 256  # worker.kernels.split_k_gemm.MAX_M (the kernels import lazily: CUDA only)


def divide(total: int, parts: int, name: str) -> int:
    if total % parts:
        raise ValueError(f"{name} ({total}) is not divisible by the tensor-parallel size ({parts})")
    return total // parts


def full_shape(loaded) -> tuple[int, ...]:
    # a torch.Tensor, or safetensors' PySafeSlice (reads nothing until indexed)
    return tuple(loaded.shape) if isinstance(loaded, torch.Tensor) else tuple(loaded.get_shape())


def narrow(loaded, dim: int, start: int, size: int) -> torch.Tensor:
    # basic indexing only, so a lazy safetensors slice reads just these rows or columns
    return loaded[(slice(None),) * dim + (slice(start, start + size),)]


def check_shape(loaded, expected: tuple[int, ...]) -> None:
    if full_shape(loaded) != tuple(expected):
        raise ValueError(
            f"shape mismatch: checkpoint has {list(full_shape(loaded))}, "
            f"the model expects {list(expected)}"
        )


def set_weight_loader(param: nn.Parameter, weight_loader: Callable[..., None]) -> None:
    """Attach the loader that worker.model.loader calls for `param` (it reads it back by getattr)."""
    # torch's stubs declare no extra Parameter attributes; this one is nano-vllm's convention
    param.weight_loader = weight_loader  # type: ignore[attr-defined]


def load_whole(param: nn.Parameter, loaded, shard_id=None) -> None:
    """weight_loader for replicated parameters (norms, a row-parallel bias)."""
    check_shape(loaded, param.shape)
    param.data.copy_(narrow(loaded, 0, 0, param.shape[0]))


def takes_skinny(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """One decode row on CUDA times a weight of at most SKINNY_MAX_N rows: the skinny kernel's."""
    return (
        x.is_cuda
        and x.dim() == 2
        and x.shape[0] == 1
        and x.stride(1) == 1
        and weight.shape[0] <= SKINNY_MAX_N
    )


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """F.linear, except on CUDA for a decode batch's few rows: one row times a weight of at most
    SKINNY_MAX_N rows goes to worker.kernels.skinny_gemm (streams W faster than cuBLAS's tiles), and
    2..256 rows of a shape the split-K sweep measured to win go to worker.kernels.split_k_gemm."""
    if not (x.is_cuda and bias is None and x.dim() == 2 and x.stride(1) == 1):
        return F.linear(x, weight, bias)
    m, n = x.shape[0], weight.shape[0]
    if takes_skinny(x, weight):
        from nanoserve.worker.kernels.skinny_gemm import skinny_gemm

        return skinny_gemm(x, weight)
    if 1 < m <= SPLIT_K_MAX_M:
        from nanoserve.worker.kernels.split_k_gemm import split_k_config, split_k_gemm

        if (config := split_k_config(m, n, weight.shape[1])) is not None:
            return split_k_gemm(x, weight, config)
    return F.linear(x, weight, bias)


def gated_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor | None:
    """silu(x W_gate^T) * (x W_up^T) of the MLP's [gate | up] weight in one kernel, where linear()
    would send x to the skinny kernel (one decode row on CUDA): a kernel boundary fewer a layer
    at batch 1. None elsewhere: the caller runs linear(), then its activation."""
    if not takes_skinny(x, weight):
        return None
    from nanoserve.worker.kernels.skinny_gemm import skinny_gemm

    return skinny_gemm(x, weight, gated=True)


class LinearBase(nn.Module):
    def __init__(self, input_size: int, output_size: int, bias: bool = False):
        super().__init__()
        self.tp_rank, self.tp_size = get_tp_rank(), get_tp_world_size()
        self.weight = nn.Parameter(torch.empty(output_size, input_size))
        set_weight_loader(self.weight, self.weight_loader)
        if bias:
            self.bias = nn.Parameter(torch.empty(output_size))
            set_weight_loader(self.bias, self.weight_loader)
        else:
            self.register_parameter("bias", None)

    def weight_loader(self, param: nn.Parameter, loaded, shard_id=None) -> None:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


class ColumnParallelLinear(LinearBase):
    """y = x W^T with W's rows split across ranks: each rank returns its slice of y's features."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False):
        super().__init__(input_size, divide(output_size, get_tp_world_size(), "output_size"), bias)

    def weight_loader(self, param, loaded, shard_id=None):
        rows = param.shape[0]
        check_shape(loaded, (rows * self.tp_size, *param.shape[1:]))
        param.data.copy_(narrow(loaded, 0, self.tp_rank * rows, rows))


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel weights stacked in one matmul (gate_proj, up_proj -> gate_up_proj);
    shard_id is the index of the checkpoint weight in output_sizes."""

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = False):
        tp_size = get_tp_world_size()
        self.shard_sizes = [
            divide(size, tp_size, f"output_sizes[{i}]") for i, size in enumerate(output_sizes)
        ]
        super().__init__(input_size, sum(output_sizes), bias)

    def weight_loader(self, param, loaded, shard_id=None):
        size = self.shard_sizes[shard_id]
        offset = sum(self.shard_sizes[:shard_id])
        check_shape(loaded, (size * self.tp_size, *param.shape[1:]))
        param.data.narrow(0, offset, size).copy_(narrow(loaded, 0, self.tp_rank * size, size))


class QKVParallelLinear(LinearBase):
    """q, k and v projections in one matmul, split by heads. Query heads are divided across ranks;
    kv heads too when there are at least tp_size of them, otherwise each rank holds a copy of the
    one kv head its query heads attend to (head rank * total_num_kv_heads // tp_size)."""

    def __init__(
        self,
        hidden_size: int,
        head_size: int,
        total_num_heads: int,
        total_num_kv_heads: int,
        bias: bool = False,
    ):
        tp_size, tp_rank = get_tp_world_size(), get_tp_rank()
        self.head_size, self.total_num_kv_heads = head_size, total_num_kv_heads
        self.num_heads = divide(total_num_heads, tp_size, "num_attention_heads")
        if total_num_kv_heads >= tp_size:
            self.num_kv_heads = divide(total_num_kv_heads, tp_size, "num_key_value_heads")
        elif tp_size % total_num_kv_heads == 0:
            self.num_kv_heads = 1  # replicated
        else:
            raise ValueError(
                f"tensor-parallel size ({tp_size}) must be a multiple of "
                f"num_key_value_heads ({total_num_kv_heads}) when it exceeds it"
            )
        self.kv_head_start = tp_rank * total_num_kv_heads // tp_size
        output_size = (self.num_heads + 2 * self.num_kv_heads) * head_size
        super().__init__(hidden_size, output_size, bias)

    def weight_loader(self, param, loaded, shard_id=None):
        # per rank the rows are [q heads | k heads | v heads]; shard_id is "q", "k" or "v"
        q_size, kv_size = self.num_heads * self.head_size, self.num_kv_heads * self.head_size
        if shard_id == "q":
            offset, size, start, total = 0, q_size, self.tp_rank * q_size, q_size * self.tp_size
        elif shard_id in ("k", "v"):
            offset = q_size if shard_id == "k" else q_size + kv_size
            size, start = kv_size, self.kv_head_start * self.head_size
            total = self.total_num_kv_heads * self.head_size
        else:
            raise ValueError(f"QKVParallelLinear: unknown shard_id {shard_id!r}")
        check_shape(loaded, (total, *param.shape[1:]))
        param.data.narrow(0, offset, size).copy_(narrow(loaded, 0, start, size))


class RowParallelLinear(LinearBase):
    """y = x W^T with W's columns split across ranks: x arrives split by features (the output of a
    column-parallel layer), each rank computes a partial sum, and an all-reduce completes it."""

    def __init__(
        self, input_size: int, output_size: int, bias: bool = False, reduce_results: bool = True
    ):
        super().__init__(divide(input_size, get_tp_world_size(), "input_size"), output_size, bias)
        # False: return this rank's partial sum; the caller all-reduces it (fused into the RMSNorm
        # that follows, worker.layers.layernorm)
        self.reduce_results = reduce_results

    def weight_loader(self, param, loaded, shard_id=None):
        if param.ndim == 1:  # the bias is replicated
            load_whole(param, loaded)
            return
        cols = param.shape[1]
        check_shape(loaded, (param.shape[0], cols * self.tp_size))
        param.data.copy_(narrow(loaded, 1, self.tp_rank * cols, cols))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the bias is added once, on rank 0, before the sum
        y = linear(x, self.weight, self.bias if self.tp_rank == 0 else None)
        return all_reduce(y) if self.tp_size > 1 and self.reduce_results else y
