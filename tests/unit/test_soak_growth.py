"""benchmarks.soak's growth after warm-up: a worker's RSS swings by tens of MiB between samples
(the allocator frees and takes back blocks), which must not read as growth, while a leak must."""

from nanoserve.benchmarks.soak import growth


def test_a_dip_in_the_first_sample_is_not_growth() -> None:
    # a CPU run's worker-2 after warm-up (3 s samples, 2026-12-06), the window starting at a dip:
    # flat near 552 MiB; the last sample less the first reads 50 MiB of "growth" from the dip
    rss = [509.5, 525.0, 544.7, 544.7, 552.1, 552.1, 552.2, 552.2, 552.2, 552.2, 552.2, 552.2]
    rss += [552.1, 552.2, 552.2, 552.2, 530.0, 546.2, 546.2, 546.2, 546.2, 546.2, 546.3]
    rss += [559.6] * 6
    assert rss[-1] - rss[0] > 50
    assert growth(rss) < 32  # (the soak's bound: 64)


def test_a_leak_is_growth() -> None:
    rss = [550.0 + 4.0 * i for i in range(32)]  # +4 MiB every sample: +124 MiB over the window
    assert growth(rss) > 90
    assert growth([7.0]) == 0.0
