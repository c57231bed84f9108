"""A torch.profiler run's kernels read back (the roofline accounts of benchmarks/roofline_kernels.py
and benchmarks/prefill.py): each kernel sorted into a class by its name, the GEMMs into the layer
op they compute by the kernels around them, tallied by class and by name a step, and the GPU's idle
gaps between them. No bounds here: the accounts set each class against its own.
"""

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
