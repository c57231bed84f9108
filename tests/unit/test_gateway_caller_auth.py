"""frontend.gateway.caller_auth: the key is checked once per token for a burst (one GetModelInfo in
flight per token, then cached), a refusal is a 401 each time, and a token no key can be is a 401
without asking the frontend."""

import asyncio
import types

import grpc
import pytest

from nanoserve.errors import error_for_code
from nanoserve.frontend.gateway.caller_auth import CallerAuth
from nanoserve.frontend.gateway.errors import OpenAIError


class FakeClient:
    def __init__(self) -> None:
        self.calls: list[str | None] = []
        self.token: str | None = None

    def with_token(self, token: str | None) -> "FakeClient":
        view = FakeClient()
        view.calls, view.token = self.calls, token
        return view

    async def model_info(self) -> None:
        self.calls.append(self.token)
        await asyncio.sleep(0.01)
        if self.token != "good":
            raise error_for_code(grpc.StatusCode.UNAUTHENTICATED, "missing or unknown token")


def request(authorization: str | None) -> types.SimpleNamespace:
    headers = {} if authorization is None else {"authorization": authorization}
    return types.SimpleNamespace(headers=headers)


def test_a_burst_checks_each_token_once() -> None:
    async def main() -> FakeClient:
        client = FakeClient()
        auth = CallerAuth(client)  # type: ignore[arg-type]
        ok = await asyncio.gather(*(auth.client_for(request("Bearer good")) for _ in range(20)))
        assert all(c.token == "good" for c in ok)
        for _ in range(3):
            with pytest.raises(OpenAIError) as refused:
                await auth.client_for(request("Bearer bad"))
            assert refused.value.status == 401
        with pytest.raises(OpenAIError) as malformed:
            await auth.client_for(request("Bearer t\xf6k"))
        assert malformed.value.status == 401
        return client

    client = asyncio.run(main())
    assert client.calls == ["good", "bad"]  # one check each; the malformed one asked nobody
