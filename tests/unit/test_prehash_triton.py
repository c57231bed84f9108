"""worker.runner.device.prehash_triton: Triton's cache key is hashed in a thread during start-up,
and the kernels after the join find it done (the same value they would compute)."""

import threading


def test_the_join_leaves_tritons_key_computed_in_its_cache() -> None:
    from triton.runtime.cache import triton_key

    from nanoserve.worker.runner.device import prehash_triton

    triton_key.cache_clear()
    join = prehash_triton()
    assert (
        any(t.name == "triton-key" for t in threading.enumerate())
        or triton_key.cache_info().currsize
    )
    join()
    assert triton_key.cache_info().currsize == 1
    hashed = triton_key()
    assert triton_key.cache_info().hits >= 1  # the kernel's call: no second hash
    triton_key.cache_clear()
    assert triton_key() == hashed
