"""Each kernel of a decode step against its own roofline bound (benchmarks/roofline.py's second
part): kernels sorted into classes by name, the GEMMs into the layer op they compute by the kernels
around them, and each class's and op's bytes and FLOPs at a batch and context.
"""

import random
import time

from nanoserve.benchmarks import workload
from nanoserve.benchmarks.step_cost import BF16, Cost, Shape, step_cost

KERNEL_CLASSES = (  # first match wins: (class, substrings of the lower-cased kernel name)
    ("allreduce", ("allreduce", "all_reduce", "nccl", "symm")),
    ("rope_kv", ("rope", "rotary", "store_kv", "kv_store", "qk_norm")),
    ("attention", ("attn", "attention", "paged", "flash", "decode", "prefill")),
    (
        "sampling",
        (
            "sampl",
            "argmax",
            "softmax",
            "topk",
            "top_k",
            "exponential",
            "gumbel",
            "sort",
            "distribution",
        ),
    ),
    ("norm", ("rms", "norm")),
    ("activation", ("silu", "swiglu", "act_and_mul", "gelu")),
    (
        "gemm",
        (
            "gemm",
            "gemv",
            "matmul",
            "xmma",
            "cutlass",
            "cublas",
            "skinny",
            "splitk",
            "sm90",
            "nvjet",
            "linear",
            "aten::mm",
            "addmm",
        ),
    ),
)


def kernel_class(name: str) -> str:
    low = name.lower()
    for cls, keys in KERNEL_CLASSES:
        if any(k in low for k in keys):
            return cls
    return "other"


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


NEIGHBOUR_SKIP = ("other", "allreduce")  # looked through when finding a GEMM's neighbours


def gemm_ops(seq: list[tuple[str, float]]) -> dict[str, dict]:
    """Kernels in launch order as (name, µs) -> {op: {"us", "calls"}} for the GEMM-class ones, named
    by the nearest kernels of other classes around each run of adjacent GEMM kernels (a GEMM and
    its split-K reduce): o_proj follows attention, down the activation; qkv is followed by rotary/KV
    store (or attention), gate_up by the activation; the LM head follows the final norm."""
    classes = [kernel_class(name) for name, _ in seq]

    def neighbour(j: int, step: int) -> str | None:
        while 0 <= j < len(seq) and classes[j] in NEIGHBOUR_SKIP:
            j += step
        return classes[j] if 0 <= j < len(seq) else None

    ops: dict[str, dict] = {}
    i = 0
    while i < len(seq):
        if classes[i] != "gemm":
            i += 1
            continue
        end = i
        while end + 1 < len(seq) and classes[end + 1] == "gemm":
            end += 1
        before, after = neighbour(i - 1, -1), neighbour(end + 1, 1)
        if before == "attention":
            op = "o_proj"
        elif before == "activation":
            op = "down"
        elif after in ("rope_kv", "attention"):
            op = "qkv"
        elif after == "activation":
            op = "gate_up"
        elif before == "norm" or after == "sampling":
            op = "lm_head"
        else:
            op = "unknown"
        row = ops.setdefault(op, dict(us=0.0, calls=0))
        row["us"] += sum(us for _, us in seq[i : end + 1])
        row["calls"] += 1
        i = end + 1
    return ops


def idle_gaps(spans: list[tuple[float, float, str]], steps: int, min_us: float = 1.0) -> dict:
    """(start µs, end µs, kernel name) of a profile's kernels -> the GPU's idle time a step and
    where it falls: the idle between two kernels (>= min_us) summed by (class before -> class
    after), the largest sites first, so a host stall or launch gap names its neighbours."""
    spans = sorted(spans)
    sites: dict[str, list[float]] = {}
    idle, small, busy_until = 0.0, 0.0, spans[0][1] if spans else 0.0
    for (_, _, before), (start, end, after) in zip(spans, spans[1:]):
        gap = start - busy_until
        busy_until = max(busy_until, end)
        if 0 < gap < min_us:  # kernel-to-kernel launch gaps (CUDA graph replay): many, each short
            small += gap
        if gap >= min_us:
            idle += gap
            key = f"{kernel_class(before)} -> {kernel_class(after)}"
            row = sites.setdefault(key, [0.0, 0])
            row[0] += gap
            row[1] += 1
    top = sorted(sites.items(), key=lambda kv: -kv[1][0])[:8]
    return dict(
        idle_us_per_step=round(idle / steps, 1),
        short_gaps_us_per_step=round(small / steps, 2),
        kernels_per_step=round(len(spans) / steps, 1),
        sites=[
            dict(site=k, us_per_step=round(us / steps, 1), gaps_per_step=round(n / steps, 1))
            for k, (us, n) in top
        ],
    )


def kernel_events(prof, cuda: bool, seq: list, spans: list) -> None:
    """Appends a torch.profiler run's kernels to seq as (start, name, µs) and, on a GPU, to spans
    as (start, end, name); on a CPU (tests) its top-level ops, so no time counts twice."""
    import torch

    for e in prof.events():
        if cuda and e.device_type == torch.autograd.DeviceType.CUDA:
            seq.append((e.time_range.start, e.name, e.device_time))
            spans.append((e.time_range.start, e.time_range.end, e.name))
        elif not cuda and e.cpu_parent is None:
            seq.append((e.time_range.start, e.name, e.cpu_time_total))


def tally(seq: list, steps: int) -> tuple[dict[str, dict], dict[str, list[float]]]:
    """kernel_events' (start, name, µs) of `steps` steps -> ({class: {"us", "calls"} a step},
    {kernel name: [µs of each call]})."""
    classes: dict[str, dict] = {}
    kernels: dict[str, list[float]] = {}
    for _, name, us in seq:
        kernels.setdefault(name, []).append(us)
        row = classes.setdefault(kernel_class(name), dict(us=0.0, calls=0.0))
        row["us"] += us / steps
        row["calls"] += 1 / steps
    return classes, kernels


def class_rows(classes: dict[str, dict], bounds_us: dict[str, float]) -> dict[str, dict]:
    """{class: {"us", "calls"} a step} -> the rows of the account, slowest first, each against its
    bound where one is known."""
    rows = {}
    for cls, c in sorted(classes.items(), key=lambda kv: -kv[1]["us"]):
        row = dict(us_per_step=round(c["us"], 1), calls_per_step=round(c["calls"], 1))
        if cls in bounds_us:
            b = bounds_us[cls]
            row.update(bound_us=round(b, 1), fraction_of_bound=round(b / c["us"], 3))
        rows[cls] = row
    return rows


def kernel_rows(kernels: dict[str, list[float]], steps: int, top: int) -> list[dict]:
    """The `top` kernels by time: name, class, µs and calls a step."""
    ranked = sorted(kernels.items(), key=lambda kv: -sum(kv[1]))[:top]
    return [
        dict(
            name=k[:70],
            cls=kernel_class(k),
            us_per_step=round(sum(v) / steps, 1),
            calls_per_step=round(len(v) / steps, 1),
        )
        for k, v in ranked
    ]


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
