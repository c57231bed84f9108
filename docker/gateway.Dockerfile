# nanoserve gateway: the OpenAI-compatible HTTP API (FastAPI on uvicorn) in front of the frontend's
# gRPC API. No tokenizer, no torch: it only translates requests and forwards callers' tokens.
# Build from the repository root:  docker build -f docker/gateway.Dockerfile -t nanoserve-gateway .

ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS wheel
WORKDIR /src
COPY pyproject.toml README.md* ./
COPY shared ./shared
COPY frontend ./frontend
COPY worker ./worker
COPY benchmarks ./benchmarks
COPY protos/nanoserve ./protos/nanoserve
COPY docker/requirements.py /tmp/requirements.py
# PIP_NO_INDEX=1 (scripts/compose_cpu.sh): pip finds everything in docker/wheelhouse, no network.
ARG PIP_NO_INDEX=0
RUN --mount=type=bind,source=docker/wheelhouse,target=/wheelhouse \
    pip wheel --no-cache-dir --no-deps --find-links /wheelhouse --wheel-dir /wheels . \
    && python /tmp/requirements.py pyproject.toml gateway tracing > /wheels/requirements.txt

FROM ${BASE_IMAGE}
RUN useradd --create-home --uid 10001 --user-group --shell /usr/sbin/nologin nanoserve
COPY docker/healthcheck.py /opt/nanoserve/healthcheck.py

# The `gateway` and `tracing` extras only: fastapi, uvicorn, pydantic, prometheus-client and the
# OpenTelemetry SDK (imported only with --otlp-traces-endpoint) on top of grpcio
# and protobuf.
# Its dependencies go in a layer of their own, keyed on their list alone (copied, not the sources),
# so that a source change reinstalls only the wheel below. docker/wheelhouse (empty in the
# repository) is where scripts/compose_cpu.sh puts the host's wheels.
COPY --from=wheel /wheels/requirements.txt /tmp/requirements.txt
ARG PIP_NO_INDEX=0
RUN --mount=type=bind,source=docker/wheelhouse,target=/wheelhouse \
    pip install --no-cache-dir --find-links /wheelhouse -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt
# the project's wheel, mounted from the stage above (no copy of it stays in a layer); every
# dependency is installed already, so pip needs no index
# hadolint ignore=DL3013
RUN --mount=type=bind,from=wheel,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index "$(ls /wheels/nanoserve-*.whl)[gateway,tracing]" \
    && ! python -c "import torch" 2>/dev/null

USER 10001:10001
WORKDIR /home/nanoserve

# Every GatewayConfig field is also a NANOSERVE_GATEWAY_<FIELD> variable.
ENV NANOSERVE_GATEWAY_HOST=0.0.0.0 \
    NANOSERVE_GATEWAY_PORT=8000 \
    PYTHONUNBUFFERED=1
EXPOSE 8000

# GET /health answers 200 while the frontend reports SERVING (503 otherwise).
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 \
    CMD ["python", "/opt/nanoserve/healthcheck.py", "http://127.0.0.1:8000/health"]

# SIGTERM: stop accepting, in-flight requests get --grace-period-s, then exit.
STOPSIGNAL SIGTERM
ENTRYPOINT ["python", "-m", "nanoserve.frontend.gateway"]
