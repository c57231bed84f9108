"""Token embedding and LM head with the vocabulary split across tensor-parallel ranks.

Rank r holds rows [r * per_rank, (r + 1) * per_rank) of the (vocab, hidden) table, per_rank =
ceil(vocab / tp_size); the last rank's rows past the vocabulary stay zero. ParallelLMHead
all-gathers the logits, so EVERY rank gets the full (B, vocab) logits and can sample identically.
"""

import torch
import torch.nn.functional as F
from torch import nn

from nanoserve.worker.layers.distributed import (
    all_gather,
    all_reduce,
    get_tp_rank,
    get_tp_world_size,
)
from nanoserve.worker.layers.linear import check_shape, narrow, set_weight_loader


class VocabParallelEmbedding(nn.Module):
    def __init__(self, num_embeddings: int, embedding_dim: int):
        super().__init__()
        self.tp_rank, self.tp_size = get_tp_rank(), get_tp_world_size()
        self.num_embeddings = num_embeddings
        self.num_embeddings_per_partition = -(-num_embeddings // self.tp_size)
        self.vocab_start_idx = min(self.tp_rank * self.num_embeddings_per_partition, num_embeddings)
        self.vocab_end_idx = min(
            self.vocab_start_idx + self.num_embeddings_per_partition, num_embeddings
        )
        self.weight = nn.Parameter(torch.zeros(self.num_embeddings_per_partition, embedding_dim))
        set_weight_loader(self.weight, self.weight_loader)

    def weight_loader(self, param: nn.Parameter, loaded, shard_id=None) -> None:
        check_shape(loaded, (self.num_embeddings, param.shape[1]))
        rows = self.vocab_end_idx - self.vocab_start_idx
        if rows > 0:
            param.data[:rows].copy_(narrow(loaded, 0, self.vocab_start_idx, rows))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (N,) token ids -> (N, hidden)
        if self.tp_size == 1:
            return F.embedding(x, self.weight)
        mask = (x >= self.vocab_start_idx) & (x < self.vocab_end_idx)
        y = F.embedding(mask * (x - self.vocab_start_idx), self.weight)
        return all_reduce(mask.unsqueeze(1) * y)


class ParallelLMHead(VocabParallelEmbedding):
    """Shares VocabParallelEmbedding's weight layout, so tied embeddings can share the parameter."""

    def forward(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        # x: (B, hidden) -> (B, per_rank) -> gathered (B, vocab) on every rank, into `out` (B,
        # vocab) when given (a CUDA graph's logits buffer): one rank's GEMM writes there directly
        if out is not None and self.tp_size == 1:
            return torch.mm(x, self.weight.t(), out=out)
        logits = F.linear(x, self.weight)
        if self.tp_size > 1:
            logits = all_gather(logits, dim=-1)[:, : self.num_embeddings]
        if out is not None:
            return out.copy_(logits)
        return logits
