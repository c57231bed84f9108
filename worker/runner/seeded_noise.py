"""Counter-based exponential noise for seeded sampling rows: the noise of a row at token v is a pure
function of (the request's seed, the output position being sampled, v), so a seed gives the same
tokens whatever else is in the batch, on rerun, and after a preemption recomputes the sequence.

worker.runner.sampler.sample calls fill_seeded_exponential once for all seeded rows of a step (one Triton
launch on CUDA; elsewhere a few in-place torch ops, over cache-sized groups of rows); SamplingInputs
builds the (row, seed, position) tensors. The hash is splitmix64 (Steele et al., "Fast splittable
pseudorandom number generators", 2014): one stream per (seed, position), indexed by the token id.
"""

import torch

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15  # splitmix64's stream increment (odd: 2**64 / phi)
MIX1, MIX2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
CACHE_ELEMENTS = 1 << 17  # int64 hash elements per step of the torch path (1 MiB)


def as_int64(value: int) -> int:
    """The int64 with the bits of value mod 2**64 (torch has no wrapping uint64 arithmetic)."""
    value &= MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


def mix64_(z: torch.Tensor, tmp: torch.Tensor | None = None) -> torch.Tensor:
    """splitmix64's finalizer, in place on int64 bit patterns (products wrap mod 2**64; a shift
    masks the sign bits torch's >> copies in). tmp: a buffer of z's shape, reused."""
    tmp = torch.empty_like(z) if tmp is None else tmp
    for shift, factor in ((30, MIX1), (27, MIX2), (31, None)):
        torch.bitwise_right_shift(z, shift, out=tmp)
        z.bitwise_xor_(tmp.bitwise_and_((1 << (64 - shift)) - 1))
        if factor is not None:
            z.mul_(as_int64(factor))
    return z


def seeded_bits(seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """(S, V) int64 random bits: row s is the stream of (seeds[s], positions[s]) at tokens 0..V-1;
    seeds and positions (S,) int64 (seeds: any int64 bit pattern)."""
    golden = as_int64(GOLDEN)
    # one key per row: the seed's stream advanced to the position, mixed again so that
    # neighbouring positions (and seeds) give unrelated streams
    keys = mix64_(mix64_(seeds.clone()) + (positions + 1) * golden)  # (S,)
    tokens = torch.arange(1, vocab_size + 1, dtype=torch.int64, device=seeds.device).mul_(golden)
    return mix64_(keys[:, None] + tokens[None, :])


def seeded_exponential(
    seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int
) -> torch.Tensor:
    """(S, V) float32 Exp(1) noise: -log(1 - u) of a uniform u from the top 53 random bits. Small
    noise (the race's winners) comes from small u, where float32 keeps every bit; u stops below
    1 so the noise stays finite (at most 16.6: a tail of 6e-8 is cut)."""
    z = seeded_bits(seeds, positions, vocab_size)
    z.bitwise_right_shift_(11).bitwise_and_((1 << 53) - 1)
    u = z.float().mul_(2.0**-53).clamp_(2.0**-60, 1.0 - 2.0**-24)
    return u.neg_().log1p_().neg_()


def fill_seeded_exponential(
    noise: torch.Tensor, rows: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor
) -> None:
    """Overwrite noise[rows] (noise (B, V) float32) with the seeded Exp(1) noise of (seeds,
    positions); rows, seeds, positions (S,) int64 on noise's device."""
    if noise.is_cuda:
        from nanoserve.worker.kernels.seeded_noise import fill_seeded_exponential as kernel

        kernel(noise, rows, seeds, positions)
        return
    # elsewhere (CPU) a few rows at a time: the ~15 passes of the hash then stay in the cache
    # (256 rows of Qwen3's vocabulary, one thread: 0.36 s this way, 1.06 s all at once)
    vocab = noise.shape[1]
    chunk = max(1, CACHE_ELEMENTS // vocab)
    for start in range(0, rows.shape[0], chunk):
        part = slice(start, start + chunk)
        noise.index_copy_(0, rows[part], seeded_exponential(seeds[part], positions[part], vocab))
