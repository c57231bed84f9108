"""GatewayConfig's stream_interval bound, and what the gateway asks the frontend for: a streamed
reply's events per --stream-interval tokens, a whole reply in the fewest messages."""

from types import SimpleNamespace
from typing import Any

import pytest

from nanoserve.frontend.gateway.config import GatewayConfig
from nanoserve.wire import MAX_STREAM_INTERVAL

pytest.importorskip("fastapi", reason="the gateway extra")


@pytest.mark.parametrize("bad", [0, -1, MAX_STREAM_INTERVAL + 1])
def test_stream_interval_is_bounded(bad: int) -> None:
    with pytest.raises(ValueError, match="stream_interval"):
        GatewayConfig(stream_interval=bad)
    assert GatewayConfig(stream_interval=MAX_STREAM_INTERVAL).stream_interval == 256


def test_whole_replies_ask_for_the_largest_interval() -> None:
    from nanoserve.frontend.gateway.app import Gateway

    gateway = Gateway(client=Any, served_model_name=None, bodies=Any, stream_interval=3)  # type: ignore[arg-type]
    assert gateway.stream_interval(SimpleNamespace(stream=True)) == 3  # type: ignore[arg-type]
    assert gateway.stream_interval(SimpleNamespace(stream=False)) == MAX_STREAM_INTERVAL  # type: ignore[arg-type]
