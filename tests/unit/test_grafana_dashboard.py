"""grafana-dashboard.json (beside docker-compose.yml) queries only series the services export (the
gateway's only where its extra, fastapi, is installed)."""

import json
import re
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from nanoserve.frontend.metrics import FrontendMetrics
from nanoserve.frontend.request_log import RequestRecord
from nanoserve.worker.service.metrics import EngineHistograms, WorkerLoad, worker_registry

try:
    from nanoserve.frontend.gateway.access import Access
    from nanoserve.frontend.gateway.metrics import GatewayMetrics
except ImportError:  # no gateway extra: its panels' series are not checked
    GatewayMetrics = None  # type: ignore[assignment,misc]

ROOT = Path(__file__).resolve().parents[2]


def exported_series() -> set[str]:
    frontend = FrontendMetrics("m")  # labelled series appear once observed
    finished = RequestRecord(
        "r",
        "Generate",
        "p",
        start=0.0,
        end=1.0,
        code="OK",
        finish_reason="length",
        completion_tokens=2,
        first_token_at=0.5,
        last_token_at=0.6,
        sent_at=0.01,
    )
    frontend.observe(finished)
    frontend.observe(
        RequestRecord("r", "Generate", "p", start=0.0, end=1.0, code="RESOURCE_EXHAUSTED")
    )
    frontend.track_in_flight(lambda: 0)
    worker = worker_registry("m", lambda: WorkerLoad(0, 0, 1, 1, 0, 0, 0, 0, 0, 0))
    EngineHistograms("m", worker)  # their series exist (zero) before any observation
    registries = [frontend.registry, worker]
    if GatewayMetrics is not None:
        gateway = GatewayMetrics()
        streamed = Access("r", "/v1/chat/completions", "POST", "p", start=0.0, status=200, end=1.0)
        streamed.first_event_at = 0.2
        gateway.observe(streamed)
        gateway.track_in_flight(lambda: 0)
        registries.append(gateway.registry)
    names = set()
    for registry in registries:
        for family in text_string_to_metric_families(generate_latest(registry).decode()):
            names.update(sample.name for sample in family.samples)
    return names


def test_dashboard_queries_exported_series() -> None:
    dashboard = json.loads((ROOT / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    used = {name for expr in exprs for name in re.findall(r"\b(?:vllm|nanoserve):\w+", expr)}
    assert len(used) >= 22
    if GatewayMetrics is None:
        used = {name for name in used if not name.startswith("nanoserve:gateway_")}
    missing = used - exported_series()
    assert not missing, missing
