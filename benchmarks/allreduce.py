"""`python -m nanoserve.benchmarks.allreduce`: per-call latency of the tensor-parallel all-reduce inside CUDA
graphs, NCCL against the symmetric-memory one-shot kernel (worker.layers.distributed), by message size; and
the all-reduce + residual add + RMSNorm of a decoder layer, unfused (one-shot, then the norm kernel)
against fused (worker.kernels.allreduce_norm).

Prints one JSON line per size; also checks that every path gives the exact sum, and that a chain of
fused calls (slots alternating, as in the model) gives the bits of the unfused chain. Needs >= 2 GPUs.
"""

import argparse
import json
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

REPS = 50  # all-reduces captured back to back in one graph


def _time_graph(fn, x: torch.Tensor) -> float:
    """µs per call of fn(x), REPS calls per replay of one captured graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn(x)  # warm-up outside capture (NCCL and symmetric memory set themselves up)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(REPS):
            fn(x)
    graph.replay()
    torch.cuda.synchronize()
    dist.barrier()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / (10 * REPS)


def _time_norm(symm, x: torch.Tensor, rank: int) -> tuple[float, float, bool]:
    """µs per all-reduce + add + RMSNorm, unfused and fused; and whether 16 chained layers' worth of
    fused calls (each one's output, scaled per rank, is the next one's partial) match unfused."""
    from nanoserve.worker.kernels import fused_add_rms_norm

    weight = torch.rand(x.shape[1], dtype=x.dtype, device=x.device) + 0.5
    residual = torch.randn_like(x)
    slot = [0]

    def fused(h, r):  # consecutive calls alternate slots, as the model's norms do
        slot[0] ^= 1
        return symm.add_rms_norm(h, r, weight, 1e-6, slot[0])

    def unfused(h, r):
        return fused_add_rms_norm(symm(h), r, weight, 1e-6)

    def chain(step) -> list[torch.Tensor]:
        h, r, outs = x.clone(), residual.clone(), []
        for _ in range(16):
            h, r = step(h.clone(), r)
            outs += [h, r]
            h = h * (rank + 1)
        return outs

    exact = all(torch.equal(p, q) for p, q in zip(chain(fused), chain(unfused)))
    return (
        _time_graph(lambda t: unfused(t, residual), x.clone()),
        _time_graph(lambda t: fused(t, residual), x.clone()),
        exact,
    )


def _worker(rank: int, world_size: int, port: int, args) -> None:
    from nanoserve.worker.layers import distributed
    from nanoserve.worker.layers.distributed import SymmetricAllReduce

    distributed.FUSED_MAX_ROWS = args.max_rows  # time the fused kernel at every size asked for
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size
    )
    dev = torch.device("cuda", rank)
    symm = SymmetricAllReduce(
        dev, max_bytes=args.max_rows * args.hidden * 2, max_rows=args.max_rows
    )
    torch.cuda.synchronize()  # the fused kernel's flags are zeroed on every rank before any use
    dist.barrier()
    for rows in args.rows:
        x = torch.randn(
            rows,
            args.hidden,
            dtype=torch.bfloat16,
            device=dev,
            generator=torch.Generator(dev).manual_seed(rank),
        )
        want = x.clone()
        dist.all_reduce(want)
        got = symm(x.clone())
        exact = bool(torch.equal(got, want))
        nccl_us = _time_graph(lambda t: dist.all_reduce(t), x.clone())
        symm_us = _time_graph(symm, x.clone())
        unfused_us, fused_us, chain_exact = _time_norm(symm, x, rank)
        if rank == 0:
            print(
                json.dumps(
                    dict(
                        bench="allreduce",
                        world_size=world_size,
                        rows=rows,
                        kib=rows * args.hidden * 2 // 1024,
                        nccl_us=round(nccl_us, 2),
                        symm_one_shot_us=round(symm_us, 2),
                        exact=exact,
                        ar_then_norm_us=round(unfused_us, 2),
                        fused_ar_norm_us=round(fused_us, 2),
                        fused_exact=chain_exact,
                    )
                ),
                flush=True,
            )
    dist.barrier()
    symm.close()
    dist.destroy_process_group()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nanoserve bench allreduce", description=__doc__)
    p.add_argument("--world-size", type=int, default=2, help="ranks, one GPU each (default: 2)")
    p.add_argument(
        "--hidden",
        type=int,
        default=4096,
        help="hidden size: bf16 values in one row of a message (default: 4096)",
    )
    p.add_argument(
        "--rows",
        type=int,
        nargs="*",
        default=[1, 4, 16, 64, 256],
        help="message sizes timed, in rows (tokens) (default: 1 4 16 64 256)",
    )
    p.add_argument(
        "--max-rows",
        type=int,
        default=256,
        help="rows the symmetric-memory buffer and the fused kernel are sized for (default: 256)",
    )
    return p


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    from nanoserve.worker.tp.rank import free_port

    mp.spawn(_worker, args=(args.world_size, free_port(), args), nprocs=args.world_size)


if __name__ == "__main__":
    main()
