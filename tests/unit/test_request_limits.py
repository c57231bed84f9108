"""Hostile-input bounds and the statuses a client can act on, without processes: lists are refused
by their length before an element is read, echoed values and details are capped, worker statuses
map to the frontend's, and the token check's key table and comparison."""

import dataclasses
import math

import grpc
import pytest

from nanoserve import security
from nanoserve.errors import (
    MAX_DETAILS_CHARS,
    Aborted,
    Internal,
    InvalidArgument,
    Unavailable,
    echo,
    worker_status_error,
)
from nanoserve.frontend.admission import (
    Limits,
    validate_messages,
    validate_prompt_token_ids,
    validate_sampling_params,
)
from nanoserve.proto.v1 import common_pb2
from nanoserve.proto.v1 import frontend_service_pb2 as frontend_pb2
from nanoserve.proto.v1 import worker_service_pb2 as worker_pb2
from nanoserve.sampling import Limits as EngineLimits
from nanoserve.sampling import SamplingError, SamplingParams
from nanoserve.sampling_proto import from_proto
from nanoserve.security import BearerTokenInterceptor, is_loopback, load_api_keys
from nanoserve.worker.service.admission import admit
from nanoserve.worker.service.request_bounds import max_request_bytes

LIMITS = Limits(
    max_model_len=4096,
    vocab_size=151936,
    max_stop_strings=16,
    max_stop_string_length=256,
    max_prompt_bytes=4 * 1024 * 1024,
)


class Unwalkable:
    """A huge list that fails the test if anything reads an element of it."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __bool__(self) -> bool:
        return self.length > 0

    def __iter__(self):
        raise AssertionError("walked before its length was checked")

    def __getitem__(self, index):
        raise AssertionError("read before its length was checked")


def test_prompt_ids_refused_by_length_before_any_is_read() -> None:
    with pytest.raises(InvalidArgument, match="prompt_token_ids: the prompt has 15000000 tokens"):
        validate_prompt_token_ids(Unwalkable(15_000_000), LIMITS, "prompt_token_ids")
    with pytest.raises(InvalidArgument, match=r"prompt_token_ids\[1\]"):
        validate_prompt_token_ids([1, LIMITS.vocab_size], LIMITS, "prompt_token_ids")
    validate_prompt_token_ids([1] * (LIMITS.max_model_len - 1), LIMITS, "prompt_token_ids")


def test_messages_refused_by_count_before_any_is_read() -> None:
    with pytest.raises(InvalidArgument, match="messages: at most 4096 messages, got 300000"):
        validate_messages(Unwalkable(300_000), LIMITS)
    messages = [frontend_pb2.ChatMessage(role="user", content="hi")] * 4096
    validate_messages(messages, LIMITS)  # protos and (role, content) pairs alike
    validate_messages([("system", "be brief"), ("user", "hi")], LIMITS)


def test_a_long_role_is_echoed_cut() -> None:
    with pytest.raises(InvalidArgument) as refused:
        validate_messages([("r" * 20_000, "hi")], LIMITS)
    message = refused.value.message
    assert message.startswith("messages[0].role: must be one of")
    assert "(20000 characters)" in message and len(message) < 250


def test_content_past_max_prompt_bytes_names_the_message() -> None:
    limits = Limits(4096, 151936, 16, 256, max_prompt_bytes=10)
    with pytest.raises(InvalidArgument, match=r"messages\[1\].content"):
        validate_messages([("user", "12345"), ("user", "世界")], limits)


def test_stop_token_ids_refused_by_count() -> None:
    params = common_pb2.SamplingParams(stop_token_ids=[1] * 3_000_000)
    with pytest.raises(InvalidArgument, match="sampling_params.stop_token_ids: at most 128"):
        validate_sampling_params(params, LIMITS)
    validate_sampling_params(common_pb2.SamplingParams(stop_token_ids=[1] * 128), LIMITS)


def test_logit_bias_and_allowed_token_ids_refused_naming_the_field() -> None:
    largest = common_pb2.SamplingParams(
        logit_bias={151935 - i: (-100.0, 100.0)[i % 2] for i in range(1024)},
        allowed_token_ids=range(151936 - 65536, 151936),
    )
    validate_sampling_params(largest, LIMITS)
    for params, refusal in [
        (
            common_pb2.SamplingParams(logit_bias={i: 1.0 for i in range(1025)}),
            "sampling_params.logit_bias: at most 1024 entries, got 1025",
        ),
        (
            common_pb2.SamplingParams(logit_bias={151936: 1.0}),
            "sampling_params.logit_bias: token id 151936 is outside the vocabulary",
        ),
        (
            common_pb2.SamplingParams(logit_bias={5: 100.5}),
            "sampling_params.logit_bias: the bias of token 5 must be a finite number",
        ),
        (common_pb2.SamplingParams(logit_bias={5: -math.inf}), "sampling_params.logit_bias: "),
        (common_pb2.SamplingParams(logit_bias={5: math.nan}), "sampling_params.logit_bias: "),
        (
            common_pb2.SamplingParams(allowed_token_ids=[1] * 65537),
            "sampling_params.allowed_token_ids: at most 65536 ids, got 65537",
        ),
        (
            common_pb2.SamplingParams(allowed_token_ids=[1, 151936]),
            "sampling_params.allowed_token_ids[1]: token id 151936 is outside the vocabulary",
        ),
    ]:
        with pytest.raises(InvalidArgument) as refused:
            validate_sampling_params(params, LIMITS)
        assert refused.value.message.startswith(refusal), refused.value.message


def test_min_tokens_with_only_ending_ids_allowed_is_refused() -> None:
    """min_tokens bans the eos and stop ids until it is met: allowing only those would leave a
    row with nothing to sample (every logit -inf), so the request is refused, naming the field."""
    limits = dataclasses.replace(LIMITS, eos_token_ids=(151645, 151643))
    for params in (
        common_pb2.SamplingParams(allowed_token_ids=[151645], min_tokens=3),
        common_pb2.SamplingParams(allowed_token_ids=[7, 151643], stop_token_ids=[7], min_tokens=1),
    ):
        with pytest.raises(InvalidArgument) as refused:
            validate_sampling_params(params, limits)
        assert refused.value.message.startswith("sampling_params.allowed_token_ids: every allowed")
    for params in (
        common_pb2.SamplingParams(allowed_token_ids=[151645, 9], min_tokens=3),  # 9 is left
        common_pb2.SamplingParams(allowed_token_ids=[151645], min_tokens=3, ignore_eos=True),
        common_pb2.SamplingParams(allowed_token_ids=[151645]),  # no min_tokens: it may end
    ):
        validate_sampling_params(params, limits)


def test_logit_bias_and_allowed_token_ids_counted_before_any_is_read() -> None:
    with pytest.raises(SamplingError, match="^logit_bias: at most 1024 entries, got 10000000"):
        SamplingParams(logit_bias=Unwalkable(10_000_000))
    with pytest.raises(SamplingError, match="^allowed_token_ids: at most 65536 ids"):
        SamplingParams(allowed_token_ids=Unwalkable(10_000_000))


def test_the_worker_checks_the_ids_against_its_vocabulary() -> None:
    limits = EngineLimits(max_model_len=64, vocab_size=512)
    for sp, refusal in [
        (SamplingParams(logit_bias={512: 1.0}), "logit_bias: token id 512 is outside"),
        (SamplingParams(allowed_token_ids=[3, 600]), r"allowed_token_ids\[1\]: token id 600"),
    ]:
        with pytest.raises(ValueError, match=refusal):
            sp.check(limits, prompt_len=2)
    SamplingParams(logit_bias={511: -100}, allowed_token_ids=[0, 511]).check(limits, 1)
    # values the frontend would refuse, sent to WorkerService directly
    with pytest.raises(ValueError, match="logit_bias: the bias of token 3 must be"):
        from_proto(common_pb2.SamplingParams(logit_bias={3: 1e9}), limits, frontend=False)
    unset = from_proto(common_pb2.SamplingParams(), limits, frontend=False)
    assert unset.logit_bias is None and unset.allowed_token_ids is None


class _Engine:
    """What request_proto.admit reads of an AsyncEngine."""

    num_requests = 0
    limits = EngineLimits(max_model_len=4096, vocab_size=2**32)

    def add(self, *args, **kwargs) -> str:
        return "queued"


def _admit(request: worker_pb2.GenerateTokensRequest) -> str:
    return admit(_Engine(), request, request.request_id or "r", 16)  # type: ignore[arg-type]


def test_worker_checks_sizes_before_copying() -> None:
    ok = worker_pb2.GenerateTokensRequest(prompt_token_ids=[1, 2, 3], cache_salt="s" * 256)
    _admit(ok)
    for request, field in [
        (worker_pb2.GenerateTokensRequest(prompt_token_ids=[1] * 4096), "prompt_token_ids"),
        (
            worker_pb2.GenerateTokensRequest(
                prompt_token_ids=[1],
                sampling_params=common_pb2.SamplingParams(stop_token_ids=[1] * 129),
            ),
            "sampling_params.stop_token_ids",
        ),
        (
            worker_pb2.GenerateTokensRequest(
                prompt_token_ids=[1],
                sampling_params=common_pb2.SamplingParams(logit_bias={i: 1.0 for i in range(1025)}),
            ),
            "sampling_params.logit_bias",
        ),
        (
            worker_pb2.GenerateTokensRequest(
                prompt_token_ids=[1],
                sampling_params=common_pb2.SamplingParams(allowed_token_ids=[1] * 65537),
            ),
            "sampling_params.allowed_token_ids",
        ),
        (
            worker_pb2.GenerateTokensRequest(prompt_token_ids=[1], cache_salt="s" * 257),
            "cache_salt",
        ),
    ]:
        with pytest.raises(InvalidArgument) as refused:
            _admit(request)
        assert refused.value.message.startswith(field)
    # the largest valid request fits the unparsed-size bound
    largest = worker_pb2.GenerateTokensRequest(
        request_id="r" * 128,
        cache_salt="s" * 256,
        prompt_token_ids=[2**32 - 1] * 4095,
        sampling_params=common_pb2.SamplingParams(
            stop_token_ids=[2**32 - 1] * 128,
            temperature=0.5,
            top_p=0.9,
            max_tokens=1,
            seed=7,
            logit_bias={2**32 - 1 - i: -100.0 for i in range(1024)},
            allowed_token_ids=[2**32 - 1] * 65536,
        ),
    )
    assert largest.ByteSize() < max_request_bytes(4096, 128)


def test_echo_and_details_are_capped() -> None:
    assert echo("user") == "'user'"
    assert echo("x" * 1000).endswith("... (1000 characters)") and len(echo("x" * 1000)) < 100
    error = InvalidArgument("y" * 100_000, field="messages")
    assert len(error.message) == MAX_DETAILS_CHARS and error.message.endswith("(truncated)")


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (grpc.StatusCode.ABORTED, Aborted),
        (grpc.StatusCode.INVALID_ARGUMENT, InvalidArgument),
        (grpc.StatusCode.UNAVAILABLE, Unavailable),
        (grpc.StatusCode.CANCELLED, Unavailable),
        (grpc.StatusCode.INTERNAL, Internal),
        (grpc.StatusCode.UNKNOWN, Internal),
    ],
)
def test_worker_statuses_the_frontend_relays(code, expected) -> None:
    error = worker_status_error(code, "request 'x' was aborted")
    assert type(error) is expected
    if code == grpc.StatusCode.ABORTED:
        assert error.message == "worker: request 'x' was aborted"
    if expected is Internal:
        assert "aborted" not in error.message  # an unexpected worker failure's details stay in


def test_api_keys_from_file_and_list(tmp_path) -> None:
    keys_file = tmp_path / "keys"
    keys_file.write_text("# comment\nalice key-a\n\nkey-anon   # no tenant name\n")
    table = load_api_keys(str(keys_file), "key-env1, key-env2,")
    assert table[b"key-a"] == "alice"
    assert set(table) == {b"key-a", b"key-anon", b"key-env1", b"key-env2"}
    assert len(table[b"key-anon"]) == 12  # a digest of the key, never the key
    keys_file.write_text("a b c\n")
    with pytest.raises(ValueError, match="TENANT KEY"):
        load_api_keys(str(keys_file))


def test_bearer_token_check() -> None:
    check = BearerTokenInterceptor({b"key-a": "alice", b"key-b": "bob"})
    assert check.tenant_of([("authorization", "Bearer key-a")]) == "alice"
    assert check.tenant_of([("x", "y"), ("authorization", "bearer key-b")]) == "bob"
    for bad in (
        [],
        None,
        [("authorization", "key-a")],
        [("authorization", "Bearer key-c")],
        [("authorization", "Basic key-a")],
        [("authorization", "Bearer ")],
    ):
        assert check.tenant_of(bad) is None
    with pytest.raises(ValueError):
        BearerTokenInterceptor({})


def test_the_cache_salt_comes_from_the_tenant_alone() -> None:
    """One salt per tenant, bounded, never the tenant's name; none without auth; the frontend
    flag accepts tenant or none."""
    import contextvars

    from nanoserve.frontend.config import FrontendConfig

    def salt_as(tenant: str | None) -> str:
        def run() -> str:
            security._tenant.set(tenant)
            return security.tenant_cache_salt()

        return contextvars.copy_context().run(run)

    assert salt_as(None) == "" and security.tenant_cache_salt() == ""
    alice, bob = salt_as("alice"), salt_as("bob")
    assert alice == salt_as("alice") and alice != bob
    assert len(alice) == len(salt_as("x" * 10_000)) == 64 and "alice" not in alice
    assert FrontendConfig(model="tiny").cache_isolation == "tenant"
    assert FrontendConfig(model="tiny", cache_isolation="none").cache_isolation == "none"
    with pytest.raises(ValueError, match="cache_isolation"):
        FrontendConfig(model="tiny", cache_isolation="request")


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.5", False),
        ("example.com", False),
    ],
)
def test_is_loopback(host, loopback) -> None:
    assert is_loopback(host) is loopback
