"""Issue 32: the frontend scopes callers' request ids by tenant. Bob sending the id of a request
alice has in flight is served (no 409/ALREADY_EXISTS that tells him alice uses it and lets him block
it); the same tenant reusing an id in flight is still refused."""

import types

import pytest

from nanoserve import security
from nanoserve.errors import AlreadyExists
from nanoserve.frontend.servicer import FrontendServicer


def servicer() -> FrontendServicer:
    s = FrontendServicer.__new__(FrontendServicer)
    s.config = types.SimpleNamespace(max_concurrent_requests=8)  # type: ignore[assignment]
    s.num_in_flight, s._live_request_ids = 0, set()
    return s


def admitted_as(s: FrontendServicer, tenant: str | None, request_id: str):
    token = security._tenant.set(tenant)
    try:
        cm = s._admit(request_id)
        assert cm.__enter__() == request_id
        return cm
    finally:
        security._tenant.reset(token)


def test_one_id_in_flight_for_two_tenants_and_refused_within_one() -> None:
    s = servicer()
    alice = admitted_as(s, "alice", "order-1234")
    bob = admitted_as(s, "bob", "order-1234")  # not refused: alice's id is none of bob's business
    with pytest.raises(AlreadyExists):
        admitted_as(s, "alice", "order-1234")
    assert s.num_in_flight == 2
    alice.__exit__(None, None, None)
    bob.__exit__(None, None, None)
    assert s.num_in_flight == 0 and not s._live_request_ids
    admitted_as(s, "alice", "order-1234").__exit__(None, None, None)  # free again once it ended
