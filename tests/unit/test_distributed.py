"""nanoserve.worker.tp.distributed over gloo on CPU: the ranks agree whether the symmetric-memory all-reduce is
used (one rank without it means NCCL/gloo for all), and all_reduce / all_gather give the sum and the
rank-ordered concatenation."""

import multiprocessing as mp

import pytest

from nanoserve.worker.tp.rank import free_port


def _rank_main(rank: int, world_size: int, port: int, fail_rank: int, results) -> None:
    import torch
    import torch.distributed as dist

    from nanoserve.worker.layers import distributed

    class FakeSymmetric:  # stands in for torch's symmetric memory, which needs CUDA peers
        def __init__(self, device, max_bytes, dtype, max_rows):
            if rank == fail_rank:
                raise RuntimeError("no peer access here")

        def fits(self, x):
            return True

        def __call__(self, x):
            return x.mul_(-1)  # marks that this path ran

        def close(self):
            pass

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size
    )
    distributed.SymmetricAllReduce = FakeSymmetric
    distributed.init_symmetric_all_reduce(torch.device("cpu"), 1024, torch.float32)
    used = distributed._symmetric is not None
    summed = distributed.all_reduce(torch.full((3,), float(rank + 1))).tolist()
    gathered = distributed.all_gather(torch.tensor([[rank, 10 + rank]]), dim=-1).tolist()
    distributed.close_symmetric_all_reduce()
    dist.destroy_process_group()
    results.put((rank, used, summed, gathered))


@pytest.mark.parametrize("fail_rank, expect_symmetric", [(1, False), (-1, True)])
def test_ranks_agree_on_the_all_reduce_path(fail_rank, expect_symmetric):
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=_rank_main, args=(r, 2, port, fail_rank, results)) for r in range(2)
    ]
    for p in procs:
        p.start()
    out = sorted(results.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    for rank, used, summed, gathered in out:
        assert used is expect_symmetric
        # the fake symmetric path negates in place; the process group sums 1 + 2
        assert summed == ([-(rank + 1.0)] * 3 if expect_symmetric else [3.0] * 3)
        assert gathered == [[0, 10, 1, 11]]
