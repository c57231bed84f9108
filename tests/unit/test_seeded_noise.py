"""Seeded sampling noise (worker.runner.seeded_noise, worker.kernels.seeded_noise): a pure function of (seed,
output position, token), drawn for all seeded rows at once; its hash, its distribution, the Triton
kernel (by the interpreter) against the torch path, and the engine's seeded runs under preemption."""

import importlib
import math
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"  # read when @triton.jit decorates: before the kernel loads

import pytest
import torch
from triton.runtime import interpreter

from nanoserve.worker import LLM, SamplingParams
from nanoserve.worker.runner import seeded_noise
from nanoserve.worker.runner.sampler import SamplingTensors, sample
from nanoserve.worker.runner.sampling_inputs import SamplingInputs
from nanoserve.worker.runner.seeded_noise import (
    GOLDEN,
    MIX1,
    MIX2,
    as_int64,
    seeded_bits,
    seeded_exponential,
)
from nanoserve.worker.sequence import Sequence
from tests.unit.hf_reference import make_hf_model

_KERNEL = "nanoserve.worker.kernels.seeded_noise"
if _KERNEL in sys.modules and not isinstance(
    sys.modules[_KERNEL]._seeded_exponential_kernel, interpreter.InterpretedFunction
):
    importlib.reload(sys.modules[_KERNEL])
from nanoserve.worker.kernels.seeded_noise import fill_seeded_exponential

M64 = (1 << 64) - 1


def splitmix(z: int) -> int:
    """splitmix64's finalizer on Python ints: the definition the tensor code must reproduce."""
    z &= M64
    z = ((z ^ (z >> 30)) * MIX1) & M64
    z = ((z ^ (z >> 27)) * MIX2) & M64
    return z ^ (z >> 31)


def test_bits_are_splitmix64_of_seed_position_and_token():
    seeds, positions = [-5, 0, 2**63 - 1, 123456789], [0, 7, 1, 4095]
    bits = seeded_bits(torch.tensor(seeds), torch.tensor(positions), 5)
    for row, (seed, pos) in enumerate(zip(seeds, positions)):
        key = splitmix(splitmix(seed) + (pos + 1) * GOLDEN)
        want = [as_int64(splitmix(key + (v + 1) * GOLDEN)) for v in range(5)]
        assert bits[row].tolist() == want


def test_noise_depends_on_its_seed_and_position_only():
    seeds, positions = torch.tensor([3, 3, 4, 3]), torch.tensor([10, 11, 10, 10])
    noise = seeded_exponential(seeds, positions, 50_000)
    assert torch.equal(noise[0], noise[3])  # same (seed, position): same noise
    assert torch.isfinite(noise).all() and (noise > 0).all()
    # each row is Exp(1): mean and variance 1
    assert torch.allclose(noise.mean(1), torch.ones(4), atol=0.02)
    assert torch.allclose(noise.var(1), torch.ones(4), atol=0.05)
    # another position or seed: an unrelated stream (|r| of 50k independent draws ~ 0.0045)
    for a, b in [(0, 1), (0, 2), (1, 2)]:
        r = torch.corrcoef(noise[[a, b]])[0, 1].item()
        assert abs(r) < 0.02, (a, b, r)
    # neighbouring tokens of one row are unrelated too
    assert abs(torch.corrcoef(torch.stack([noise[0, :-1], noise[0, 1:]]))[0, 1].item()) < 0.02


def test_uniforms_pass_kolmogorov_smirnov():
    noise = seeded_exponential(torch.tensor([17]), torch.tensor([2]), 100_000)[0].double()
    u = torch.sort(1 - torch.exp(-noise)).values  # Exp(1) -> U(0, 1)
    n = u.numel()
    grid = torch.arange(1, n + 1, dtype=torch.float64) / n
    d = torch.maximum(grid - u, u - (grid - 1 / n)).max().item()
    assert d < 1.63 / math.sqrt(n)  # the 1% critical value


LOGITS = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -1.0, -3.0, 0.2])


def chi_square(ids: torch.Tensor, probs: torch.Tensor) -> float:
    counts = torch.bincount(ids, minlength=probs.numel()).double()
    want = probs.double() * ids.numel()
    return ((counts - want) ** 2 / want).sum().item()


@pytest.mark.parametrize("over", ["positions", "seeds"])
def test_seeded_rows_sample_the_softmax(over):
    """20k seeded draws (one seed over 20k positions, or 20k seeds at one position) follow the
    categorical softmax(LOGITS / 0.8): chi-square with 7 degrees of freedom."""
    n, temperature = 20_000, 0.8
    if over == "positions":
        seeds, positions = torch.full((n,), 42), torch.arange(n)
    else:
        seeds, positions = torch.arange(n) * 7919 - 10**9, torch.full((n,), 3)
    t = SamplingTensors(
        temperatures=torch.full((n,), temperature),
        top_ks=None,
        top_ps=None,
        min_ps=None,
        seeded=(torch.arange(n), seeds, positions),
        num_seeded=n,
    )
    ids = sample(LOGITS.expand(n, -1), t)
    assert chi_square(ids, (LOGITS / temperature).softmax(-1)) < 24.3  # p = 0.001


def test_seeded_rows_ignore_the_rest_of_the_batch():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 300, generator=gen)
    seeds, positions = torch.tensor([11, 12, 13]), torch.tensor([0, 5, 9])

    def run(order: list[int], batch_gen: int) -> list[int]:
        # rows 0..2 of `logits` are seeded; order puts them (and unseeded ones) anywhere
        where = {src: dst for dst, src in enumerate(order)}
        seeded = [src for src in order if src < 3]
        t = SamplingTensors(
            temperatures=torch.ones(len(order)),
            top_ks=None,
            top_ps=None,
            min_ps=None,
            seeded=(
                torch.tensor([where[s] for s in seeded]),
                seeds[seeded],
                positions[seeded],
            ),
            num_seeded=len(seeded),
        )
        ids = sample(logits[order], t, torch.Generator().manual_seed(batch_gen)).tolist()
        return [ids[where[s]] for s in range(3) if s in where]

    alone = run([0, 1, 2], 0)
    assert run([5, 2, 3, 0, 4, 1], 1) == alone
    assert run([4, 1, 0, 3, 2], 2) == alone
    assert run([2, 0, 1], 3) == alone  # only seeded rows: no global draw at all


def test_unseeded_batch_keeps_the_global_generator_path():
    logits = torch.randn(4, 100, generator=torch.Generator().manual_seed(1))
    t = SamplingTensors(temperatures=torch.ones(4), top_ks=None, top_ps=None, min_ps=None)
    ids = sample(logits, t, torch.Generator().manual_seed(5))
    noise = torch.empty(4, 100).exponential_(generator=torch.Generator().manual_seed(5))
    assert torch.equal(ids, (logits.softmax(-1) / noise).argmax(-1))


def test_kernel_matches_the_torch_path():
    seeds = torch.tensor([as_int64(-5), 0, 1, 2**62, 123])
    positions = torch.tensor([0, 0, 1, 3, 900])
    rows = torch.tensor([4, 0, 2, 1, 5])
    vocab = 2500  # not a multiple of the kernel's block
    noise = torch.full((7, vocab), -1.0)
    fill_seeded_exponential(noise, rows, seeds, positions)
    want = seeded_exponential(seeds, positions, vocab)
    torch.testing.assert_close(noise[rows], want, rtol=2e-5, atol=1e-6)
    assert (noise[[3, 6]] == -1).all()  # rows not seeded are left alone


def test_cpu_path_in_groups_of_rows_equals_all_at_once():
    vocab = 2500  # CACHE_ELEMENTS // 2500 = 52 rows a group: 120 rows are 3 groups
    gen = torch.Generator().manual_seed(3)
    seeds = torch.randint(-(2**62), 2**62, (120,), generator=gen)
    positions = torch.randint(0, 5000, (120,), generator=gen)
    rows = torch.randperm(130, generator=gen)[:120]
    noise = torch.full((130, vocab), -1.0)
    seeded_noise.fill_seeded_exponential(noise, rows, seeds, positions)
    assert torch.equal(noise[rows], seeded_exponential(seeds, positions, vocab))
    assert (noise.min(1).values == -1).sum() == 10  # the 10 rows not listed are left alone


def test_sampling_inputs_positions_are_output_indices():
    inputs = SamplingInputs(torch.device("cpu"), 100)
    seqs = [
        Sequence([1, 2, 3], SamplingParams(temperature=1.0, seed=-7)),
        Sequence([1, 2], SamplingParams(temperature=1.0)),
        Sequence([4, 5, 6, 7], SamplingParams(temperature=1.0, seed=2**64 - 1)),
    ]
    seqs[0].token_ids += [9, 9]  # two output tokens: the next one sampled is output index 2
    t = inputs.prepare(seqs)
    assert t.seeded is not None and t.num_seeded == 2
    rows, seeds, positions = t.seeded
    assert rows.tolist() == [0, 2] and seeds.tolist() == [-7, -1] and positions.tolist() == [2, 0]
    unseeded = inputs.prepare([seqs[1]])
    assert unseeded.seeded is None and unseeded.num_seeded == 0


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("seeded_noise")
    make_hf_model(path)
    return path


def test_seeded_tokens_survive_preemption(model_path):
    """Preempted and recomputed sequences draw the same noise at the same output positions:
    each seeded request gives the tokens it gives alone with a roomy cache."""
    prompts = [[(7 * i + j) % 500 + 2 for j in range(n)] for i, n in enumerate([5, 33, 18, 70])]
    params = [
        SamplingParams(temperature=0.9, seed=100 + i, max_tokens=24, ignore_eos=True)
        for i in range(len(prompts))
    ]
    roomy = LLM(model_path, device="cpu", kvcache_block_size=16, num_kvcache_blocks=128)
    alone = [roomy.generate([p], sp, use_tqdm=False)[0].token_ids for p, sp in zip(prompts, params)]
    tight = LLM(model_path, device="cpu", kvcache_block_size=16, num_kvcache_blocks=12)
    together = [o.token_ids for o in tight.generate(prompts, params, use_tqdm=False)]
    assert tight.scheduler.num_preemptions > 0
    assert together == alone
