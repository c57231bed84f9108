"""The decode attention's launch rules (worker.kernels.decode_attention), from shapes only: how many
shares a sequence's context is cut into, how long a share is at least, and the K/V tile and launch
options by batch. A CUDA graph captures what they chose; benchmarks.variants swaps them for A/Bs.
"""

import functools

import torch
import triton

MAX_SPLITS = 16
# share length at batches that fill the GPU without splitting: long enough that the merge is cheap
# against the K/V reads, short enough that a batch of mixed lengths is cut into even work
BALANCED_SPLIT_LEN = 512
# launch options of the kernel where TILE_RULES has none (benchmarks.attention.sweep_decode_configs
# times others)
DECODE_CONFIG = dict(num_warps=4, num_stages=3)
# (largest batch, tokens a tile, num_warps, num_stages) by rising batch for a 16-bit cache, from
# sweep_decode_configs on the H200 (c16e497, µs a call, mixed lengths 100..2048, against 64 tokens,
# 4 warps, 3 stages): B=16 24.6 vs 27.3, B=64 74.2 vs 76.6. From B=128 up no option was better by
# 1% (B=256 at 1,024 tokens each: 32-token tiles on 2 warps 253 vs 264, but over mixed lengths
# 286 vs 283 and the workload 1-2% slower). Up to 8 sequences the plain tile: with 128-token
# tiles batch-1 decode took 1.070-1.075 ms a token against 1.059-1.061 (d936067). Past the rows
# and for an fp8 cache: 64 tokens and DECODE_CONFIG.
TILE_RULES: list[tuple[int, int, int, int]] = [(8, 64, 4, 3), (64, 128, 4, 2)]


@functools.cache
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def choose_num_splits(batch: int, num_kv_heads: int, max_context: int, device: torch.device) -> int:
    """Splits per (sequence, kv head), from shapes only: the grid's third axis.

    Rule: aim for ~2 programs per SM (H200: 132 SMs -> 264 programs) for a batch of the longest
    possible context (max_blocks * block_size), up to MAX_SPLITS, keeping >= 256 tokens of it per
    split so the merge stays cheap against the K/V reads. A (batch * num_kv_heads) grid that already
    reaches that splits each sequence into shares of BALANCED_SPLIT_LEN tokens (choose_split_len):
    a long sequence then runs on several SMs while short ones take one program each.
    """
    sms = _num_sms(device.index or 0) if device.type == "cuda" else 132
    programs = batch * num_kv_heads
    if programs >= 2 * sms:
        return max(1, min(MAX_SPLITS, triton.cdiv(max_context, BALANCED_SPLIT_LEN)))
    splits = triton.cdiv(2 * sms, programs)
    return max(1, min(splits, MAX_SPLITS, triton.cdiv(max_context, 256)))


def choose_block_n(block_size: int) -> int:
    """Tokens a K/V tile where TILE_RULES has none: 64 for every cache dtype. 128-token tiles over
    an fp8 cache (as many bytes a tile as bf16's 64) were slower on the H200 at 98cfe19:
    mixed-length B=256 250 vs 237 µs, the engine's B=256 step 8.5 vs 7.5 ms of attention."""
    return min(64, block_size)


def choose_tiles(batch: int, block_size: int, cache_dtype: torch.dtype) -> tuple[int, dict]:
    """(tokens a tile, launch options) from shapes only: TILE_RULES' row for the batch over a
    16-bit cache, else choose_block_n and DECODE_CONFIG (2 stages over an fp32 cache: its tiles
    are twice the bytes). The tile never exceeds the block."""
    if cache_dtype.itemsize == 2:
        for max_batch, block_n, warps, stages in TILE_RULES:
            if batch <= max_batch:
                return min(block_n, block_size), dict(num_warps=warps, num_stages=stages)
    if cache_dtype.itemsize == 4:
        return choose_block_n(block_size), dict(DECODE_CONFIG, num_stages=2)
    return choose_block_n(block_size), dict(DECODE_CONFIG)


def choose_split_len(batch: int, num_kv_heads: int, device: torch.device) -> int:
    """The shortest share in tokens, from shapes only: BALANCED_SPLIT_LEN where the batch alone
    fills the GPU (choose_num_splits), else one tile (64), so a small batch's sequences are cut
    into num_splits even shares for latency."""
    sms = _num_sms(device.index or 0) if device.type == "cuda" else 132
    return BALANCED_SPLIT_LEN if batch * num_kv_heads >= 2 * sms else 64
