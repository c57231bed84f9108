"""Comparing top-k logprob lists from two runs of one model: float noise may order near-tied tokens
either way (a tiny random checkpoint's logits are nearly flat), so ids match up to such ties."""

import pytest


def assert_same_top(
    got_ids: list[int], got_lps: list[float], want_ids: list[int], want_lps: list[float], tol: float
) -> None:
    """Logprobs equal within tol rank by rank; a rank's id is the reference's, or one the reference
    gives a logprob within 2·tol of that rank's (a tie), or a tie at the cut-off past its k."""
    assert len(got_ids) == len(want_ids) and len(set(got_ids)) == len(got_ids)
    assert got_lps == pytest.approx(want_lps, abs=tol)
    want = dict(zip(want_ids, want_lps, strict=True))
    for rank, (got_id, got_lp) in enumerate(zip(got_ids, got_lps, strict=True)):
        if got_id == want_ids[rank]:
            continue
        if got_id in want:
            assert abs(want[got_id] - want_lps[rank]) <= 2 * tol, (rank, got_id, want_ids)
        else:
            assert abs(got_lp - want_lps[-1]) <= 2 * tol, (rank, got_id, want_ids)
