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
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM ${BASE_IMAGE}
COPY --from=wheel /wheels /wheels
# The `gateway` extra only: fastapi, uvicorn, pydantic and prometheus-client on top of grpcio
# and protobuf.
# hadolint ignore=DL3013
RUN WHEEL="$(ls /wheels/nanoserve-*.whl)" \
    && pip install --no-cache-dir "${WHEEL}[gateway]" \
    && rm -rf /wheels \
    && ! python -c "import torch" 2>/dev/null
COPY docker/healthcheck.py /opt/nanoserve/healthcheck.py

RUN useradd --create-home --uid 10001 --user-group --shell /usr/sbin/nologin nanoserve
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
