"""Each kernel of a decode step against its own roofline bound (benchmarks/roofline.py's second
part): each class's and GEMM op's bytes and FLOPs at a batch and context, and the profiled decode
and prefill steps read against them (the kernels sorted and tallied by benchmarks/kernel_classes.py).
"""

import random
import time

from nanoserve.benchmarks import workload
from nanoserve.benchmarks.kernel_classes import (
    class_rows,
    gemm_ops,
    idle_gaps,
    kernel_class,
    kernel_events,
    kernel_rows,
    tally,
)
from nanoserve.benchmarks.step_cost import BF16, Cost, Shape, step_cost


def class_costs(shape: Shape, batch: int, context: int) -> dict[str, Cost]:
    """Bytes and FLOPs of each kernel class in one decode step of `batch` sequences that each
    attend to `context` tokens."""
    q, kv, h, L = (
        shape.heads * shape.head_dim,
        shape.kv_heads * shape.head_dim,
        shape.hidden,
        shape.layers,
    )
    b = batch
    w = (shape.linear_params + shape.lm_head_params) * BF16
    gemm_act = b * (L * (h + (q + 2 * kv) + q + h + h + 2 * shape.inter + shape.inter + h)) * BF16
    return {
        "gemm": Cost(
            w + gemm_act + b * shape.vocab * 4, 2 * b * (shape.linear_params + shape.lm_head_params)
        ),
        "attention": Cost(
            b * context * shape.kv_bytes_per_token + 2 * b * L * q * BF16,
            4 * b * context * shape.heads * shape.head_dim * L,
        ),
        "rope_kv": Cost(b * L * (2 * (q + kv) + 2 * kv) * BF16, 0),  # q, k in and out; k, v stored
        # residual add + RMSNorm: 2 reads, 2 writes
        "norm": Cost(b * (2 * L + 1) * 4 * h * BF16, 0),
        "activation": Cost(b * L * 3 * shape.inter * BF16, 0),
        "sampling": Cost(2 * b * shape.vocab * 4, 0),
    }


def gemm_op_costs(shape: Shape, batch: int) -> dict[str, Cost]:
    """Each GEMM of a decode step, all layers together: weights plus activations in and out (the
    LM head's logits in fp32)."""
    h, i = shape.hidden, shape.inter
    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    dims = {
        "qkv": (h, q + 2 * kv, shape.layers),
        "o_proj": (q, h, shape.layers),
        "gate_up": (h, 2 * i, shape.layers),
        "down": (i, h, shape.layers),
        "lm_head": (h, shape.vocab, 1),
    }
    out = {}
    for op, (k, n, count) in dims.items():
        act = batch * (k * BF16 + n * (4 if op == "lm_head" else BF16))
        out[op] = Cost(count * (k * n * BF16 + act), count * 2 * batch * k * n)
    return out


def profile_decode(
    llm, shape: Shape, batch: int, context: int, steps: int = 16, mixed: bool = False
) -> dict:
    """torch.profiler over `steps` decode steps at `batch` x `context`: per kernel class and per
    GEMM op the GPU time a step against its bound, the kernels that fill the step and the GPU's
    idle gaps. mixed: contexts uniform in [100, 2 * context] (the workload's shrinking phase), not
    all `context`."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from nanoserve.benchmarks.engine import sync
    from nanoserve.worker import SamplingParams

    rng = random.Random(batch)
    lens = [rng.randint(100, 2 * context) if mixed else context for _ in range(batch)]
    prompts = [[rng.randrange(1000) for _ in range(n)] for n in lens]
    # room for the decode steps that mix into the prefills before the profiled ones
    sp = SamplingParams(temperature=0, max_tokens=steps + 32, ignore_eos=True)
    llm.generate(prompts, sp, use_tqdm=False)  # warm-up, and the prompts into the prefix cache
    for p in prompts:
        llm.add_request(p, sp)
    # the prefills: prefix hits up to the last full block, which is recomputed (256 x a block's
    # tokens take several steps at the batch's token budget): profile only once every sequence
    # decodes, or prefill kernels land in the decode account
    sched = llm.scheduler
    while sched.waiting or any(s.num_computed_tokens < s.num_prompt_tokens for s in sched.running):
        llm.step()
    llm.step()
    sync(llm)
    cuda = torch.cuda.is_available()  # on a CPU (tests): the ops' CPU time, same accounting
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        t = time.perf_counter()
        for _ in range(steps):
            llm.step()
        sync(llm)
        wall = (time.perf_counter() - t) / steps
    while not llm.is_finished():
        llm.step()
    seq: list = []  # (start, name, µs) of every kernel
    spans: list = []  # (start, end, name) of every GPU kernel
    kernel_events(prof, cuda, seq, spans)
    seq.sort()
    kernels: dict[str, list[float]] = {}
    for _, name, us in seq:
        kernels.setdefault(name, []).append(us)
    op_bounds = gemm_op_costs(shape, batch)
    gemm = {}
    for op, row in sorted(gemm_ops([(n, us) for _, n, us in seq]).items()):
        gemm[op] = dict(
            us_per_step=round(row["us"] / steps, 1), calls_per_step=round(row["calls"] / steps, 1)
        )
        if op in op_bounds:
            b = op_bounds[op].bound_s * 1e6
            gemm[op].update(bound_us=round(b, 1), fraction_of_bound=round(b * steps / row["us"], 3))
    # the bound at the mean context (the K/V bytes are linear in it)
    bounds = class_costs(shape, batch, round(sum(lens) / batch) + 1)
    classes: dict[str, dict] = {}
    for name, times in kernels.items():
        c = classes.setdefault(kernel_class(name), dict(us=0.0, calls=0.0))
        c["us"] += sum(times) / steps
        c["calls"] += len(times) / steps
    by_class = class_rows(classes, {cls: c.bound_s * 1e6 for cls, c in bounds.items()})
    step_bound = sum(bounds.values(), Cost(0, 0)).bound_s * 1e6
    gpu = sum(c["us"] for c in classes.values())
    return dict(
        batch=batch,
        context=context,
        mixed=mixed,
        mean_context=round(sum(lens) / batch),
        wall_us_per_step=round(1e6 * wall, 1),
        gpu_busy_us_per_step=round(gpu, 1),
        step_bound_us=round(step_bound, 1),
        fraction_of_bound=round(step_bound / (1e6 * wall), 3),
        classes=by_class,
        gemm_ops=gemm,
        idle=idle_gaps(spans, steps),
        kernels=[
            # the class's bound shared over its calls: the kernel's own
            row
            | dict(
                bound_us_per_call=round(
                    bounds[row["cls"]].bound_s * 1e6 / classes[row["cls"]]["calls"], 2
                )
                if row["cls"] in bounds
                else None
            )
            for row in kernel_rows(kernels, steps, 16)
        ],
    )


def profile_prefill(llm, shape: Shape, tokens: int = 16384, repeats: int = 3) -> dict:
    """torch.profiler over `repeats` prefill-only steps of `tokens` new tokens each (fresh prompts of
    100..1024 tokens, nothing cached, nothing decoding): per kernel class the GPU time a step against
    the class's bound, the largest kernels, the GPU's idle gaps, and the host's time preparing the
    step's inputs (prepare_prefill)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from nanoserve.benchmarks.engine import sync
    from nanoserve.worker import SamplingParams

    rng = random.Random(tokens)
    vocab = llm.model_config.vocab_size
    sp = SamplingParams(temperature=0.6, max_tokens=1, ignore_eos=True)
    runner = llm.model_runner
    prepare, prepared = runner._prepare_prefill, []

    def timed_prepare(*a, **kw):
        t = time.perf_counter()
        out = prepare(*a, **kw)
        prepared.append(time.perf_counter() - t)
        return out

    cuda = torch.cuda.is_available()
    seq: list = []  # (start, name, µs) of every kernel of the profiled steps
    spans: list = []  # (start, end, name) of every GPU kernel
    walls: list[float] = []
    host: list[float] = []
    bounds = Cost(0, 0)
    gemm_b = attn_b = Cost(0, 0)
    runner._prepare_prefill = timed_prepare
    try:
        for r in range(repeats + 1):  # the first set warms up (its kernels compiled, not counted)
            lens = workload.step_lengths(tokens, rng)
            total = sum(lens)
            for n in lens:
                llm.add_request([rng.randrange(vocab) for _ in range(n)], sp)
            sync(llm)
            prepared.clear()
            with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as p:
                t = time.perf_counter()
                llm.step()
                sync(llm)
                wall = time.perf_counter() - t
            while not llm.is_finished():
                llm.step()
            if r == 0:
                continue
            walls.append(wall)
            host.append(prepared[0])  # the profiled step's (the rest: steps that finished them)
            step = step_cost(shape, [(0, n) for n in lens])
            gemm = Cost(
                (shape.linear_params + shape.lm_head_params) * BF16,
                2 * total * shape.linear_params + 2 * len(lens) * shape.lm_head_params,
            )
            bounds, gemm_b = bounds + step, gemm_b + gemm
            attn_b += Cost(0, step.flops - gemm.flops)  # causal QK^T and PV
            kernel_events(p, cuda, seq, spans)
    finally:
        del runner._prepare_prefill
    classes, kernels = tally(seq, repeats)
    by_class = class_rows(
        classes,
        {"gemm": 1e6 * gemm_b.bound_s / repeats, "attention": 1e6 * attn_b.bound_s / repeats},
    )
    wall = sum(walls) / repeats
    return dict(
        tokens=tokens,
        wall_us_per_step=round(1e6 * wall, 1),
        host_prepare_us=round(1e6 * sum(host) / repeats, 1),
        gpu_busy_us_per_step=round(sum(c["us"] for c in classes.values()), 1),
        step_bound_us=round(1e6 * bounds.bound_s / repeats, 1),
        fraction_of_bound=round(bounds.bound_s / repeats / wall, 3),
        classes=by_class,
        idle=idle_gaps(spans, repeats),
        kernels=kernel_rows(kernels, repeats, 12),
    )
