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
CMD_STEP_AHEAD = 3  # a decode step whose input ids come from rank 0's device broadcast (lookahead)
CMD_COPY_BLOCKS = 4  # copy-on-write before the next step: header[2] pairs (source, destination)


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
    # the last P of the R logit rows are prompt positions (prompt logprobs): every rank computes
    # their LM head prompt_chunk_rows at a time (the same all-gathers under tensor parallelism)
    num_prompt_rows: int = 0
    prompt_chunk_rows: int = 0

    @property
    def dims(self) -> tuple[int, int, int, int]:
        """(tokens N, sequences B, block-table width W, logit rows R): they size every field."""
        return (
            len(self.input_ids),
            len(self.context_lens),
            self.block_tables.shape[1],
            len(self.logit_rows),
        )

    def encode(self, cmd: int = CMD_STEP) -> np.ndarray:
        header = np.zeros(HEADER_LEN, dtype=np.int64)
        header[:11] = [
            VERSION,
            cmd,
            int(self.is_prefill),
            *self.dims,
            self.max_seqlen_q,
            self.max_seqlen_k,
            self.num_prompt_rows,
            self.prompt_chunk_rows,
        ]
        parts = [
            header,
            self.input_ids,
            self.positions,
            self.slot_mapping,
            self.cu_seqlens_q,
            self.context_lens,
            self.block_tables.reshape(-1),
            self.logit_rows,
        ]
        return np.concatenate([np.asarray(p, dtype=np.int64) for p in parts])

    @staticmethod
    def decode(buf: np.ndarray) -> "StepInputs":
        version, cmd, is_prefill, n, b, w, r, max_q, max_k, p, chunk = (int(x) for x in buf[:11])
        if version != VERSION or cmd not in (CMD_STEP, CMD_STEP_AHEAD):
            raise ValueError(f"step message version {version} / command {cmd} not understood")
        ids, positions, slots, cu_q, context_lens, tables, rows = split_message(buf, (n, b, w, r))
        return StepInputs(
            bool(is_prefill),
            ids,
            positions,
            slots,
            cu_q,
            context_lens,
            tables,
            rows,
            max_q,
            max_k,
            p,
            chunk,
        )


def field_sizes(n: int, b: int, w: int, r: int) -> list[int]:
    """Words of each array field, in message order."""
    return [n, n, n, b + 1, b, b * w, r]


def max_message_words(
    max_num_batched_tokens: int, max_num_seqs: int, max_blocks_per_seq: int
) -> int:
    """Upper bound of len(StepInputs.encode()) for an engine's limits."""
    n = max(max_num_batched_tokens, max_num_seqs)
    return HEADER_LEN + sum(field_sizes(n, max_num_seqs, max_blocks_per_seq, n))


def split_message(msg, dims: tuple[int, int, int, int]) -> list:
    """Views of an encoded message (numpy array or device tensor) in field order: input_ids,
    positions, slot_mapping, cu_seqlens_q, context_lens, block_tables (B, W), logit_rows."""
    parts, at = [], HEADER_LEN
    for size in field_sizes(*dims):
        parts.append(msg[at : at + size])
        at += size
    parts[5] = parts[5].reshape(dims[1], dims[2])
    return parts


def copy_blocks_message(copies: list[tuple[int, int]]) -> np.ndarray:
    """KV blocks to copy (n > 1 copy-on-write): the header, then the (source, destination) pairs."""
    header = np.zeros(HEADER_LEN, dtype=np.int64)
    header[:3] = [VERSION, CMD_COPY_BLOCKS, len(copies)]
    return np.concatenate([header, np.asarray(copies, dtype=np.int64).reshape(-1)])


def decode_copies(msg: np.ndarray) -> list[tuple[int, int]]:
    pairs = msg[HEADER_LEN : HEADER_LEN + 2 * int(msg[2])].reshape(-1, 2)
    return [(int(src), int(dst)) for src, dst in pairs]


def message_len(header: np.ndarray) -> int:
    """Words of the message that starts with `header` (the exit message is the header alone)."""
    if header[1] == CMD_COPY_BLOCKS:
        return HEADER_LEN + 2 * int(header[2])
    if header[1] not in (CMD_STEP, CMD_STEP_AHEAD):
        return HEADER_LEN
    return HEADER_LEN + sum(field_sizes(*(int(v) for v in header[3:7])))


def exit_message() -> np.ndarray:
    header = np.zeros(HEADER_LEN, dtype=np.int64)
    header[:2] = [VERSION, CMD_EXIT]
    return header
