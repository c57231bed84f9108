"""Turns the last-token logits of a batch into next token ids, one row per sequence.

Called by ModelRunner after compute_logits. allowed_token_ids, logit_bias, penalties, the min_tokens
mask and a grammar's bitmask, then greedy rows by argmax and the rest by temperature -> top-k -> top-p
-> min-p -> an exponential race (Gumbel-max without a host sync). A step of plain rows on CUDA takes
one Triton pass instead (worker.kernels.sample_rows).
Seeded rows draw their noise from a counter-based hash of (seed, output position, token)
(worker.runner.seeded_noise), so a seed gives the same tokens whatever else is in the batch.
"""

from dataclasses import dataclass

import torch

from nanoserve.worker.runner.seeded_noise import fill_seeded_exponential


@dataclass(slots=True)
class SamplingTensors:
    temperatures: torch.Tensor | None  # (B,) float32, 0 = greedy; None when all rows are greedy
    top_ks: torch.Tensor | None  # (B,) int64, vocab size = disabled; None when no row uses it
    top_ps: torch.Tensor | None  # (B,) float32
    min_ps: torch.Tensor | None  # (B,) float32
    # penalties: None when no row uses them
    repetition_penalties: torch.Tensor | None = None  # (B,)
    presence_penalties: torch.Tensor | None = None  # (B,)
    frequency_penalties: torch.Tensor | None = None  # (B,)
    prompt_mask: torch.Tensor | None = None  # (S, V) bool, token occurs in the prompt
    output_counts: torch.Tensor | None = None  # (S, V) float32, occurrences in the output
    penalty_rows: torch.Tensor | None = None  # (B,) int64 row of each sequence; None: S = B
    # seeded rows: (rows, seeds, positions), each (S,) int64; position = the index in the output
    # of the token sampled now. None when no row is seeded
    seeded: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    num_seeded: int = 0  # S, known on the host: a batch of only seeded rows skips the global draw
    # min_tokens: (rows, token ids) of the eos / stop ids that rows still under min_tokens may not
    # sample (vLLM); None when no row is under its min_tokens
    banned: tuple[torch.Tensor, torch.Tensor] | None = None
    # structured output: (rows (G,) int64 or None for all rows, bitmask (G, ceil(V/32)) int32) of
    # the rows with a grammar, bit t set = token t allowed (worker.core.grammars); None
    # when no row has one
    allowed: tuple[torch.Tensor | None, torch.Tensor] | None = None
    # logit_bias: (rows, token ids) int64 and biases float32, each (N,), one entry per (row, token)
    # pair; None when no row has a bias (worker.runner.token_rules builds both)
    logit_bias: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    # allowed_token_ids: (restricted rows (G,), rows (M,), token ids (M,)) int64: each restricted
    # row keeps only the tokens of its (row, token) pairs; None when no row restricts them
    allowed_token_ids: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    all_greedy: bool = False
    # the largest top-k of any row, known on the host (vocab size where a row has none); None:
    # not known, filter_logits sorts the whole vocabulary
    max_top_k: int | None = None


# top-k filtering from torch.topk of this many columns instead of a sort of the vocabulary, where
# every row's top-k is at most this (Qwen3's generation_config: top_k 20 with top_p 0.95, so every
# request that leaves sampling to the model's defaults)
TOP_K_PREFILTER = 1024


def apply_token_rules(logits: torch.Tensor, t: SamplingTensors) -> None:
    """allowed_token_ids (-inf elsewhere), then logit_bias (added), in place on (B, V) float32
    logits the caller owns; only the listed rows and (row, token) pairs are touched."""
    if t.allowed_token_ids is not None:
        restricted, rows, ids = t.allowed_token_ids
        kept = logits[rows, ids]  # (M,) the allowed tokens' logits
        logits.index_fill_(0, restricted, float("-inf")).index_put_((rows, ids), kept)
    if t.logit_bias is not None:
        rows, ids, biases = t.logit_bias
        # each (row, token) pair occurs once (a dict's keys): gather, add, scatter back
        logits.index_put_((rows, ids), logits[rows, ids] + biases)


def adjusted_logits(logits: torch.Tensor, t: SamplingTensors) -> torch.Tensor:
    """(B, V) float32: the logits after each row's own rules, in vLLM v1's order: allowed_token_ids,
    then logit_bias (and the min_tokens mask: -inf either way), then the penalties (a bias is
    added before repetition_penalty scales the logit). Temperature and top-k / top-p / min-p come
    after, in sample(). Out of place: the logits may be a view of a CUDA graph's output."""
    copied = logits.dtype != torch.float32  # then .float() made a copy the rules may change
    logits = logits.float()
    if t.allowed_token_ids is not None or t.logit_bias is not None:
        logits = logits if copied else logits.clone()
        apply_token_rules(logits, t)
    if t.repetition_penalties is not None:
        logits = apply_penalties(logits, t)
    if t.banned is not None:
        logits = logits.index_put(t.banned, logits.new_full((), float("-inf")))
    return logits


def apply_penalties(logits: torch.Tensor, t: SamplingTensors) -> torch.Tensor:
    prompt_mask, counts = t.prompt_mask, t.output_counts
    rep_penalties, presence, frequency = (
        t.repetition_penalties,
        t.presence_penalties,
        t.frequency_penalties,
    )
    # SamplingInputs sets the penalty fields together, and sample() calls this only when they are
    assert (
        prompt_mask is not None
        and counts is not None
        and rep_penalties is not None
        and presence is not None
        and frequency is not None
    )
    if t.penalty_rows is not None:  # rows of the persistent statistics -> (B, V)
        prompt_mask, counts = prompt_mask[t.penalty_rows], counts[t.penalty_rows]
    # repetition penalty (CTRL / vLLM): shrink the logits of tokens seen in prompt or output
    seen = prompt_mask | (counts > 0)
    rep = rep_penalties[:, None].expand_as(logits)
    penalized = torch.where(logits > 0, logits / rep, logits * rep)
    logits = torch.where(seen, penalized, logits)
    # presence / frequency penalties (OpenAI): output tokens only
    logits = logits - frequency[:, None] * counts
    return logits - presence[:, None] * (counts > 0).to(logits.dtype)


def _top_k_top_p(sorted_logits: torch.Tensor, t: SamplingTensors) -> torch.Tensor:
    """sorted_logits: (B, C) each row's C largest logits, descending -> those top-k and top-p
    exclude set to -inf (top-p over the top-k survivors, renormalized: vLLM's order)."""
    if t.top_ks is not None:
        ranks = torch.arange(sorted_logits.shape[-1], device=sorted_logits.device)[None, :]
        sorted_logits = sorted_logits.masked_fill(ranks >= t.top_ks[:, None], float("-inf"))
    if t.top_ps is not None:
        probs = sorted_logits.softmax(dim=-1)
        # keep a token while the mass before it is < top_p (the first token is always kept)
        mass_before = probs.cumsum(dim=-1) - probs
        sorted_logits = sorted_logits.masked_fill(mass_before >= t.top_ps[:, None], float("-inf"))
    return sorted_logits


def filter_logits(logits: torch.Tensor, t: SamplingTensors) -> torch.Tensor:
    """Mask (with -inf) the tokens that top-k, top-p and min-p exclude. logits: (B, V) scaled."""
    k = t.max_top_k
    if t.top_ks is not None and k is not None and k <= min(TOP_K_PREFILTER, logits.shape[-1]):
        # every row keeps at most k tokens: the k largest (sorted) are all top-p needs, and the
        # same probabilities as over the whole row, whose other tokens top-k sets to -inf
        top, order = logits.topk(k, dim=-1)
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, _top_k_top_p(top, t))
    elif t.top_ks is not None or t.top_ps is not None:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        filtered = _top_k_top_p(sorted_logits, t)
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, filtered)
    if t.min_ps is not None:
        probs = logits.softmax(dim=-1)
        threshold = t.min_ps[:, None] * probs.max(dim=-1, keepdim=True).values
        logits = logits.masked_fill(probs < threshold, float("-inf"))
    return logits


def processed_logits(logits: torch.Tensor, t: SamplingTensors) -> torch.Tensor:
    """(B, V) float32: the logits each row samples from (logprobs_mode "processed"): its rules
    (allowed_token_ids, logit_bias, penalties, the min_tokens mask: adjusted_logits) and its
    grammar's bitmask, as `sample` applies them, then for sampled rows temperature and the
    top-k/top-p/min-p filter (-inf); greedy rows stop after the rules (their argmax is the sampled
    token)."""
    logits = adjusted_logits(logits, t)
    if t.allowed is not None:
        logits = apply_token_bitmask(logits, *t.allowed)
    if t.all_greedy or t.temperatures is None:
        return logits
    temperatures = t.temperatures
    scaled = filter_logits(logits / temperatures.clamp_min(1e-6)[:, None], t)
    return torch.where((temperatures == 0)[:, None], logits, scaled)


def apply_token_bitmask(
    logits: torch.Tensor, rows: torch.Tensor | None, bitmask: torch.Tensor
) -> torch.Tensor:
    """-inf where a row's bitmask clears a token (out of place). logits (B, V); rows (G,) the rows
    the bitmask's (G, ceil(V/32)) int32 words are for (None: all B, in order); bit t = token t."""
    g = bitmask.shape[0]
    table = _bits_of_byte(bitmask.device)
    # one byte lookup per 8 tokens: little-endian words, so byte k holds tokens 8k..8k+7
    allowed = table[bitmask.view(torch.uint8).long()].reshape(g, -1)[:, : logits.shape[1]]
    if rows is None:
        return logits.masked_fill(~allowed, float("-inf"))
    masked = logits[rows].masked_fill(~allowed, float("-inf"))
    return logits.index_copy(0, rows, masked)


_BYTE_BITS: dict[torch.device, torch.Tensor] = {}


def _bits_of_byte(device: torch.device) -> torch.Tensor:
    """(256, 8) bool: bit j of byte value b."""
    table = _BYTE_BITS.get(device)
    if table is None:
        b = torch.arange(256, device=device)[:, None]
        table = _BYTE_BITS[device] = ((b >> torch.arange(8, device=device)) & 1).bool()
    return table


def is_plain(t: SamplingTensors) -> bool:
    """No row of the step uses anything but temperature (or greedy): no top-k/top-p/min-p, rule,
    penalty, min_tokens mask, grammar or seed."""
    return (
        t.top_ks is None
        and t.top_ps is None
        and t.min_ps is None
        and t.repetition_penalties is None
        and t.presence_penalties is None
        and t.frequency_penalties is None
        and t.banned is None
        and t.allowed is None
        and t.logit_bias is None
        and t.allowed_token_ids is None
        and t.seeded is None
    )


def sample(
    logits: torch.Tensor, t: SamplingTensors, generator: torch.Generator | None = None
) -> torch.Tensor:
    """logits: (B, V) -> (B,) int64 token ids; `generator` serves the unseeded rows. A plain step on
    CUDA samples in one pass over the logits (worker.kernels.sample_rows: the same distribution,
    other noise); otherwise the rules, a float32 copy and the race below."""
    if logits.is_cuda and logits.stride(-1) == 1 and is_plain(t):
        from nanoserve.worker.kernels.sample_rows import sample_rows

        return sample_rows(logits, None if t.all_greedy else t.temperatures, generator)
    logits = adjusted_logits(logits, t)
    if t.allowed is not None:
        logits = apply_token_bitmask(logits, *t.allowed)
    greedy = logits.argmax(dim=-1)
    if t.all_greedy:
        return greedy
    temperatures = t.temperatures
    assert temperatures is not None  # None only when every row is greedy (all_greedy)
    temps = temperatures.clamp_min(1e-6)[:, None]
    probs = filter_logits(logits / temps, t).softmax(dim=-1)
    noise = torch.empty_like(probs)
    if t.num_seeded < probs.shape[0]:
        noise.exponential_(generator=generator)
    if t.seeded is not None:  # one draw for all seeded rows, however many
        fill_seeded_exponential(noise, *t.seeded)
    sampled = (probs / noise).argmax(dim=-1)
    return torch.where(temperatures == 0, greedy, sampled)
