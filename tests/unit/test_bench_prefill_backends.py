"""benchmarks.prefill_backends (a GPU benchmark) fits torch's varlen attention to the keywords this
torch has: a case whose keyword it lacks is left out, not an error mid-run."""

from nanoserve.benchmarks import prefill_backends


def test_varlen_cases_follow_this_torch_s_keywords() -> None:
    assert prefill_backends._varlen({"no_such_keyword": 1}) is None
    plain = prefill_backends._varlen({})
    assert plain is None or callable(plain)  # None only where torch has no varlen_attn
