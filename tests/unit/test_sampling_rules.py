"""One table of sampling-field ranges: the frontend (proto) and the worker (SamplingParams) agree."""

import math

import pytest

from nanoserve.sampling_rules import RULES, violations
from nanoserve.worker.sampling_params import SamplingParams

BAD = [
    ("temperature", -0.1),
    ("top_p", 0.0),
    ("top_p", 1.5),
    ("top_k", -2),
    ("min_p", 1.1),
    ("max_tokens", 0),
    ("min_tokens", -1),
    ("repetition_penalty", 0.0),
    ("presence_penalty", 2.5),
    ("frequency_penalty", -3.0),
    ("temperature", math.nan),
    ("top_p", math.inf),
    ("n", 0),
    ("n", 17),
]


@pytest.mark.parametrize("name, value", BAD)
def test_both_sides_refuse_the_same_values(name, value):
    assert [n for n, _ in violations({name: value})] == [name]
    with pytest.raises(ValueError, match=name):
        SamplingParams(**{name: value})


def test_defaults_are_valid_and_min_tokens_is_bounded_by_max_tokens():
    assert not list(
        violations(
            {
                name: getattr(SamplingParams(), name)
                for name in RULES
                if getattr(SamplingParams(), name) is not None
            }
        )
    )
    assert list(violations({"min_tokens": 5, "max_tokens": 4})) == [
        ("min_tokens", "<= max_tokens (4)")
    ]
