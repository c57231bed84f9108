"""The all-reduce + residual add + RMSNorm kernel (Triton interpreter on CPU): one rank equals
fused_add_rms_norm; two ranks are simulated from one rank's side (the peer's row and flag already
pushed here), which checks the push to the peer, the sum in rank order, the flag handshake and the
flags left clean."""

import pytest
import torch

from nanoserve.worker.kernels.allreduce_norm import allreduce_add_rms_norm
from nanoserve.worker.kernels.norm import fused_add_rms_norm

M, HIDDEN = 3, 96


def ptrs(*tensors: torch.Tensor) -> torch.Tensor:
    return torch.tensor([t.data_ptr() for t in tensors], dtype=torch.int64)


def inputs(seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(
        torch.randn(*shape, generator=g).bfloat16()
        for shape in [(M, HIDDEN), (M, HIDDEN), (M, HIDDEN), (HIDDEN,)]
    )


@pytest.mark.parametrize("slot", [0, 1])
def test_one_rank_is_the_fused_norm(slot):
    x, _, residual, weight = inputs(0)
    buffer = torch.zeros(2, M * HIDDEN, dtype=torch.bfloat16)
    flags = torch.zeros(M, dtype=torch.int32)
    gens, error = torch.zeros(M, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    out, new_residual = allreduce_add_rms_norm(
        x, residual, weight, 1e-6, ptrs(buffer), ptrs(flags), slot, M * HIDDEN, 0, gens, error
    )
    ref_out, ref_residual = fused_add_rms_norm(x, residual, weight, 1e-6)
    assert torch.equal(out, ref_out) and torch.equal(new_residual, ref_residual)
    assert not buffer.any() and not flags.any()  # no peer: nothing pushed, no flag raised
    assert not error.any()


@pytest.mark.parametrize("rank", [0, 1])
def test_two_ranks_sum_in_rank_order_and_leave_the_flags_clean(rank):
    x_rank0, x_rank1, residual, weight = inputs(1)
    mine, peers = (x_rank0, x_rank1) if rank == 0 else (x_rank1, x_rank0)
    # each rank's buffer: (2 slots, 2 source ranks, M * HIDDEN); this call uses slot 1
    buffers = [torch.zeros(2, 2, M * HIDDEN, dtype=torch.bfloat16) for _ in range(2)]
    flags = [torch.zeros(M, 2, dtype=torch.int32) for _ in range(2)]
    peer = 1 - rank
    buffers[rank][1, peer] = peers.flatten()  # the peer has pushed its partial here and flagged it
    gens, error = torch.full((M,), 6, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    flags[rank][:, peer] = 7  # the generation after the 6 calls each rank has made on these rows
    out, new_residual = allreduce_add_rms_norm(
        mine, residual, weight, 1e-6, ptrs(*buffers), ptrs(*flags), 1, M * HIDDEN, rank, gens, error
    )
    assert torch.equal(buffers[peer][1, rank].view(M, HIDDEN), mine)  # pushed to the peer
    assert not buffers[peer][0].any() and not buffers[peer][1, peer].any()
    # rank order, rounded once to bf16 (by truncation: Triton's interpreter truncates where the
    # GPU rounds to nearest even)
    summed = ((x_rank0.float() + x_rank1.float()).view(torch.int32) & -65536).view(torch.float32)
    summed = summed.bfloat16()
    ref_out, ref_residual = fused_add_rms_norm(summed, residual, weight, 1e-6)
    assert torch.equal(out, ref_out) and torch.equal(new_residual, ref_residual)
    assert not flags[rank].any()  # the peer's flags were consumed
    assert flags[peer][:, rank].tolist() == [7] * M and not flags[peer][:, peer].any()
    assert gens.tolist() == [7] * M and not error.any()


@pytest.mark.parametrize(
    "peer_flag, code",
    [(0, 2), (6, 3), (8, 3)],
    ids=["peer_never_arrives", "peer_a_call_behind", "peer_a_call_ahead"],
)
def test_a_wait_that_cannot_succeed_ends_with_an_error_word(peer_flag, code):
    """Rank 0 of two at generation 7: a peer that never raises its flag, or raises one of another
    call (kernels out of order), ends the bounded wait with the error word set (on the GPU the
    kernel then traps)."""
    x, _, residual, weight = inputs(2)
    buffers = [torch.zeros(2, 2, M * HIDDEN, dtype=torch.bfloat16) for _ in range(2)]
    flags = [torch.zeros(M, 2, dtype=torch.int32) for _ in range(2)]
    flags[0][:, 1] = peer_flag
    gens, error = torch.full((M,), 6, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    allreduce_add_rms_norm(
        x,
        residual,
        weight,
        1e-6,
        ptrs(*buffers),
        ptrs(*flags),
        0,
        M * HIDDEN,
        0,
        gens,
        error,
        max_spins=20,
    )
    assert error.item() == code
    assert flags[1][:, 0].tolist() == [7] * M  # this rank's own flag went out
