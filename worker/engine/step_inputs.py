"""The host-side inputs of one forward step, and their flat int64 encoding.

ModelRunner.prepare_* builds a StepInputs from the scheduled Sequences; under tensor parallelism rank 0
writes its encoding into shared memory and the other ranks decode it (a versioned header and raw
int64 arrays: no pickle).
"""
from dataclasses import dataclass

import numpy as np

VERSION = 1
HEADER_LEN = 16
CMD_STEP, CMD_EXIT = 1, 2


@dataclass(slots=True)
class StepInputs:
    is_prefill: bool
    input_ids: np.ndarray  # (N,) token ids of the scheduled tokens
    positions: np.ndarray  # (N,)
    slot_mapping: np.ndarray  # (N,) KV-cache slot of each token
    cu_seqlens_q: np.ndarray  # (B + 1,)
    context_lens: np.ndarray  # (B,) kv length of each sequence after this step
    block_tables: np.ndarray  # (B, W), -1 padded
    logit_rows: np.ndarray  # (R,) rows of the hidden states to compute logits for
    max_seqlen_q: int
    max_seqlen_k: int

    def encode(self) -> np.ndarray:
        n, b = len(self.input_ids), len(self.context_lens)
        w, r = self.block_tables.shape[1], len(self.logit_rows)
        header = np.zeros(HEADER_LEN, dtype=np.int64)
        header[:9] = [VERSION, CMD_STEP, int(self.is_prefill), n, b, w, r, self.max_seqlen_q,
                      self.max_seqlen_k]
        parts = [header, self.input_ids, self.positions, self.slot_mapping, self.cu_seqlens_q,
                 self.context_lens, self.block_tables.reshape(-1), self.logit_rows]
        return np.concatenate([np.asarray(p, dtype=np.int64) for p in parts])

    @staticmethod
    def decode(buf: np.ndarray) -> "StepInputs":
        version, cmd, is_prefill, n, b, w, r, max_q, max_k = (int(x) for x in buf[:9])
        if version != VERSION or cmd != CMD_STEP:
            raise ValueError(f"step message version {version} / command {cmd} not understood")
        sizes = [n, n, n, b + 1, b, b * w, r]
        arrays, at = [], HEADER_LEN
        for size in sizes:
            arrays.append(buf[at:at + size])
            at += size
        ids, pos, slots, cu, ctx_lens, tables, rows = arrays
        return StepInputs(bool(is_prefill), ids, pos, slots, cu, ctx_lens, tables.reshape(b, w),
                          rows, max_q, max_k)


def exit_message() -> np.ndarray:
    header = np.zeros(HEADER_LEN, dtype=np.int64)
    header[:2] = [VERSION, CMD_EXIT]
    return header
