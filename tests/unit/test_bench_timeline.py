"""benchmarks/timeline.py's gap account over a made-up timeline (the GPU run is
`python -m nanoserve.benchmarks.timeline`)."""

import pytest

from nanoserve.benchmarks.timeline import gap_account, phase_of_kernel, short_name


def test_gaps_by_size_phase_and_site():
    spans = [
        (0.0, 100.0, "_prefill_kernel"),
        (100.5, 200.0, "gemm_a"),  # a 0.5 µs launch gap
        (2200.0, 2300.0, "_decode_split_kernel"),  # a 2 ms host stall, still in the prefill
        (2310.0, 2320.0, "Memcpy DtoH (Device -> Pinned)"),  # 10 µs, now in decode
        (2315.0, 2330.0, "gemm_b"),  # overlaps the copy: no gap, busy counted once
        (2333.0, 2340.0, "_decode_split_kernel"),  # 3 µs
    ]
    acc = gap_account(spans, wall_us=2500.0)
    assert acc["busy_s"] == pytest.approx((100 + 99.5 + 100 + 20 + 7) / 1e6, abs=1e-6)
    assert acc["idle_s"] == pytest.approx((0.5 + 2000 + 10 + 3) / 1e6, abs=1e-6)
    assert acc["gpu_span_s"] == pytest.approx(2340 / 1e6)
    sizes = {r["at"]: r["gaps"] for r in acc["by_size"]}
    assert sizes == {"<1us": 1, "<5us": 1, "<20us": 1, "<100us": 0, "<1000us": 0, ">=1000us": 1}
    phases = {r["at"]: r["ms"] for r in acc["by_phase"]}
    assert phases == {
        "prefill": pytest.approx(2.0, abs=0.01),
        "decode": pytest.approx(0.01, abs=0.005),
    }
    assert acc["sites"][0] == dict(at="gemm_a -> _decode_split_kernel", ms=2.0, gaps=1)
    assert len(acc["sites"]) == 3  # the sub-µs launch gap names no site
    assert acc["idle_fraction_of_wall"] == pytest.approx(1 - 326.5 / 2500, abs=1e-4)


def test_empty_timeline_and_names():
    assert gap_account([], 10.0)["busy_s"] == 0.0
    assert short_name("Memcpy HtoD (Pinned -> Device)") == "Memcpy HtoD"
    assert short_name("void cutlass::Kernel<foo>(bar)") == "void cutlass::Kernel"
    assert phase_of_kernel("_prefill_kernel") == "prefill"
    assert phase_of_kernel("_decode_split_kernel") == "decode"
    assert phase_of_kernel("nvjet_gemm") is None
