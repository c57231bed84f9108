"""Plain sampling in one pass over the logits (worker.runner.sampler.sample, CUDA, when no row of the step
uses top-k/top-p/min-p, penalties, logit rules, a grammar or a seed): each row's greedy argmax, or
its exponential race argmax(logits / T - log E), E ~ Exp(1), read straight from the bf16 logits.

Grid (rows, cdiv(V, BLOCK)): each program scores one BLOCK of a row and writes its best (score,
token); the caller takes each row's best chunk (the earliest on ties, as torch.argmax). The noise is
worker.kernels.seeded_noise's counter hash of (a per-step seed drawn from the sampler's generator,
row, token): stream_exponential, so no (B, V) float32 copy, softmax or noise tensor is written.
"""

import torch
import triton
import triton.language as tl

from nanoserve.worker.kernels.seeded_noise import stream_exponential

BLOCK = 4096


# the per-row scalars' pointers are not specialised on their 16-byte alignment: each program loads
# one element, and a step's rows may start anywhere in a copied (4, B) block (one kernel a dtype)
@triton.jit(do_not_specialize_on_alignment=["temperatures_ptr", "seed_ptr"])
def _sample_chunk_kernel(
    logits_ptr,
    temperatures_ptr,  # (B,) float32, 0 = greedy
    seed_ptr,  # (1,) int64: this step's seed
    best_ptr,  # (B, chunks) float32
    token_ptr,  # (B, chunks) int32
    stride,
    vocab,
    BLOCK: tl.constexpr,
    ALL_GREEDY: tl.constexpr,
):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    cols = chunk * BLOCK + tl.arange(0, BLOCK)
    valid = cols < vocab
    logits = tl.load(
        logits_ptr + row.to(tl.int64) * stride + cols, mask=valid, other=float("-inf")
    ).to(tl.float32)
    score = logits
    if not ALL_GREEDY:
        temperature = tl.load(temperatures_ptr + row)
        if temperature > 0.0:  # one branch a program: a row is greedy or not
            seed = tl.load(seed_ptr).to(tl.uint64, bitcast=True)
            e = stream_exponential(seed, row.to(tl.uint64), cols)
            score = tl.where(valid, logits / temperature - tl.log(e), float("-inf"))
    best, token = tl.max(score, 0, return_indices=True, return_indices_tie_break_left=True)
    num_chunks = tl.num_programs(1)
    tl.store(best_ptr + row * num_chunks + chunk, best)
    tl.store(token_ptr + row * num_chunks + chunk, chunk * BLOCK + token)


def sample_rows(
    logits: torch.Tensor,
    temperatures: torch.Tensor | None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """logits (B, V) with unit stride in V, any float dtype; temperatures (B,) float32 (0 =
    greedy) or None for all greedy -> (B,) int64 token ids. One seed a call from `generator`."""
    rows, vocab = logits.shape
    if logits.stride(1) != 1:
        raise ValueError("sample_rows needs logits with unit stride over the vocabulary")
    if rows == 0:
        return torch.empty(0, dtype=torch.int64, device=logits.device)
    chunks = triton.cdiv(vocab, BLOCK)
    best = torch.empty(rows, chunks, dtype=torch.float32, device=logits.device)
    tokens = torch.empty(rows, chunks, dtype=torch.int32, device=logits.device)
    all_greedy = temperatures is None
    if all_greedy:  # no noise: nothing drawn, the generator stays where it is
        temperatures = seed = best  # unread by the ALL_GREEDY specialisation
    else:
        seed = torch.randint(
            -(2**63), 2**63 - 1, (1,), dtype=torch.int64, device=logits.device, generator=generator
        )
    _sample_chunk_kernel[(rows, chunks)](
        logits,
        temperatures,
        seed,
        best,
        tokens,
        logits.stride(0),
        vocab,
        BLOCK=BLOCK,
        ALL_GREEDY=all_greedy,
    )
    pick = best.argmax(dim=1, keepdim=True)  # the earliest chunk on ties
    return tokens.gather(1, pick).squeeze(1).long()
