"""FrontendConfig.max_connection_age_s: its default ages connections only where processes share
the port and the kernel migrates a stopping socket's queued connections (tcp_migrate_req), and
server_options turns it into gRPC core's max_connection_age_ms (unbounded grace: calls finish)."""

from pathlib import Path

import pytest

from nanoserve.frontend.config import REUSE_PORT_MAX_AGE_S, FrontendConfig
from nanoserve.frontend.server import connection_age_s
from nanoserve.grpc_options import server_options


@pytest.fixture
def migrate_req(tmp_path: Path) -> Path:
    return tmp_path / "tcp_migrate_req"


def age(migrate_req: Path, **fields) -> float:
    return connection_age_s(FrontendConfig(model="tiny", **fields), migrate_req)


def test_default_ages_connections_where_processes_share_the_port_and_the_kernel_migrates(
    migrate_req: Path,
) -> None:
    migrate_req.write_text("1\n")
    assert age(migrate_req, reuse_port=True) == REUSE_PORT_MAX_AGE_S
    assert age(migrate_req) == 0.0  # alone on its port: a new connection reaches the same process
    migrate_req.write_text("0\n")  # Linux's default: a stopping process resets its queued ones
    assert age(migrate_req, reuse_port=True) == 0.0
    migrate_req.unlink()  # not Linux, or a kernel before 5.14
    assert age(migrate_req, reuse_port=True) == 0.0


def test_the_operators_age_wins_either_way(migrate_req: Path) -> None:
    migrate_req.write_text("1")
    assert age(migrate_req, reuse_port=True, max_connection_age_s=0) == 0
    assert age(migrate_req, max_connection_age_s=3.5) == 3.5
    migrate_req.write_text("0")
    assert age(migrate_req, reuse_port=True, max_connection_age_s=0.2) == 0.2


@pytest.mark.parametrize("bad", [-1.0, float("nan")])
def test_a_negative_or_nan_age_is_refused_by_name(bad: float) -> None:
    with pytest.raises(ValueError, match="max_connection_age_s"):
        FrontendConfig(model="tiny", max_connection_age_s=bad)


def test_server_options_set_the_age_in_milliseconds_only_when_asked() -> None:
    assert "grpc.max_connection_age_ms" not in dict(server_options())
    options = dict(server_options(max_age_s=0.5))
    assert options["grpc.max_connection_age_ms"] == 500
    assert "grpc.max_connection_age_grace_ms" not in options  # core's default: no limit
