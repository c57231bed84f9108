"""Latency statistics of the benchmarks: percentiles of a list of samples, and the same per bucket
of a key (TTFT by prompt length). Pure Python, so the load generator's results need no numpy.
"""

from collections.abc import Iterable, Sequence

PERCENTILES = (50, 90, 99)


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) of ascending values, linear between ranks (numpy's default)."""
    if not sorted_values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"q must be in [0, 100], got {q}")
    rank = (len(sorted_values) - 1) * q / 100
    lo = int(rank)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (rank - lo)


def summarize(values: Iterable[float], scale: float = 1.0, digits: int = 2) -> dict:
    """{"n", "p50", "p90", "p99", "max", "mean"} of `values` times `scale` (1000: s -> ms);
    {"n": 0} when there are none."""
    v = sorted(x * scale for x in values)
    if not v:
        return {"n": 0}
    out: dict = {"n": len(v)}
    out.update({f"p{q}": round(percentile(v, q), digits) for q in PERCENTILES})
    out["max"] = round(v[-1], digits)
    out["mean"] = round(sum(v) / len(v), digits)
    return out


def bucket_label(key: int, edges: Sequence[int]) -> str:
    """`edges` (ascending) split the integers into [0, e0), [e0, e1), ..., [e_last, inf):
    labels "<e0", "e0-(e1-1)", ..., ">=e_last"."""
    if not edges or key < edges[0]:
        return f"<{edges[0]}" if edges else "all"
    for lo, hi in zip(edges, edges[1:]):
        if key < hi:
            return f"{lo}-{hi - 1}"
    return f">={edges[-1]}"


def summarize_by_bucket(
    pairs: Iterable[tuple[int, float]], edges: Sequence[int], scale: float = 1.0
) -> dict[str, dict]:
    """(key, value) pairs -> {bucket label: summarize(values)}, buckets in ascending order, empty
    buckets left out."""
    edges = sorted(edges)
    groups: dict[str, list[float]] = {}
    order = {bucket_label(k, edges): i for i, k in enumerate([-1, *edges])}
    for key, value in pairs:
        groups.setdefault(bucket_label(key, edges), []).append(value)
    return {
        label: summarize(groups[label], scale) for label in sorted(groups, key=order.__getitem__)
    }
