"""Exponential noise of the seeded sampling rows in one launch (CUDA; worker.runner.seeded_noise is the torch
reference and the CPU path): program (s, j) hashes tokens j*BLOCK.. of seeded row s and writes
them into that row of the step's (B, V) noise.
"""

import torch
import triton
import triton.language as tl

# splitmix64's constants as uint64 literals (Triton reads globals only as constexpr): the same as
# worker.runner.seeded_noise's, which imports this module (tests hold the two paths to the same noise)
GOLDEN = tl.constexpr(0x9E3779B97F4A7C15)
MIX1 = tl.constexpr(0xBF58476D1CE4E5B9)
MIX2 = tl.constexpr(0x94D049BB133111EB)


@triton.jit
def _mix64(z):
    # splitmix64's finalizer on uint64 (logical shifts, wrapping products)
    z = (z ^ (z >> 30)) * MIX1
    z = (z ^ (z >> 27)) * MIX2
    return z ^ (z >> 31)


@triton.jit
def stream_exponential(seed, index, cols):
    """Exp(1) noise at tokens `cols` of the stream of (seed, index), both uint64 (index: the output
    position of a seeded row, or a row of sample_rows' step): -log1p(-u) of a uniform u from the
    hash's top 53 bits, with the series where 1 - u would round (small noise: the race's winners)."""
    key = _mix64(_mix64(seed) + (index + 1) * GOLDEN)
    z = _mix64(key + (cols.to(tl.uint64) + 1) * GOLDEN)
    u = (z >> 11).to(tl.float32) * 1.1102230246251565e-16  # top 53 bits * 2**-53
    u = tl.minimum(tl.maximum(u, 8.673617379884035e-19), 1.0 - 5.960464477539063e-08)
    series = u * (1.0 + u * (0.5 + u * (1.0 / 3.0)))
    return tl.where(u < 0.0078125, series, -tl.log(1.0 - u))


# rows, seeds and positions are rows of one (3, S) int64 copy: seeds start 8·S bytes in, 16-byte
# aligned for even S only, so specialising on alignment would compile twice while serving
@triton.jit(do_not_specialize_on_alignment=["rows_ptr", "seeds_ptr", "positions_ptr"])
def _seeded_exponential_kernel(
    noise_ptr,
    rows_ptr,
    seeds_ptr,
    positions_ptr,
    stride,
    vocab,
    BLOCK: tl.constexpr,
):
    s = tl.program_id(0)
    row = tl.load(rows_ptr + s).to(tl.int64)
    seed = tl.load(seeds_ptr + s).to(tl.uint64, bitcast=True)
    position = tl.load(positions_ptr + s).to(tl.uint64, bitcast=True)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    e = stream_exponential(seed, position, cols)
    tl.store(noise_ptr + row * stride + cols, e, mask=cols < vocab)


def fill_seeded_exponential(
    noise: torch.Tensor, rows: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor
) -> None:
    """Overwrite noise[rows] (noise (B, V) float32, unit stride in V) with the seeded Exp(1)
    noise of (seeds, positions); rows, seeds, positions (S,) int64."""
    assert noise.dtype == torch.float32 and noise.stride(1) == 1
    num_rows, vocab = rows.shape[0], noise.shape[1]
    if num_rows == 0:
        return
    block = 1024
    grid = (num_rows, triton.cdiv(vocab, block))
    _seeded_exponential_kernel[grid](
        noise, rows, seeds, positions, noise.stride(0), vocab, BLOCK=block
    )
