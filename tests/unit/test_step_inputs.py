"""The tensor-parallel step message: encode/decode round trip, its length, versioning."""

import numpy as np
import pytest

from nanoserve.worker.runner.step_inputs import (
    HEADER_LEN,
    StepInputs,
    exit_message,
    max_message_words,
    message_len,
)


def example() -> StepInputs:
    return StepInputs(
        True,
        np.arange(5),
        np.arange(5) + 10,
        np.arange(5) + 20,
        np.array([0, 2, 5]),
        np.array([2, 5]),
        np.array([[3, -1, -1], [4, 5, -1]]),
        np.array([1, 4]),
        3,
        5,
        num_prompt_rows=1,
        prompt_chunk_rows=256,
    )


def test_round_trip_and_length():
    x = example()
    msg = x.encode()
    assert message_len(msg[:HEADER_LEN]) == len(msg)
    y = StepInputs.decode(msg.copy())
    for field in (
        "input_ids",
        "positions",
        "slot_mapping",
        "cu_seqlens_q",
        "context_lens",
        "block_tables",
        "logit_rows",
    ):
        assert np.array_equal(getattr(x, field), getattr(y, field)), field
    assert (y.is_prefill, y.max_seqlen_q, y.max_seqlen_k) == (True, 3, 5)
    assert (y.num_prompt_rows, y.prompt_chunk_rows) == (1, 256)  # every rank chunks alike
    assert len(msg) <= max_message_words(5, 2, 3)


def test_unknown_version_is_refused():
    msg = example().encode()
    msg[0] = 99
    with pytest.raises(ValueError, match="version"):
        StepInputs.decode(msg)
    assert message_len(exit_message()) == HEADER_LEN


def test_copy_blocks_message_round_trip():
    from nanoserve.worker.runner.step_inputs import (
        CMD_COPY_BLOCKS,
        copy_blocks_message,
        decode_copies,
        message_len,
    )

    msg = copy_blocks_message([(3, 9), (4, 11)])
    assert msg[1] == CMD_COPY_BLOCKS and message_len(msg) == len(msg)
    assert decode_copies(msg) == [(3, 9), (4, 11)]
