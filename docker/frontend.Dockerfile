# nanoserve frontend: the CPU half (validate, admit, tokenize, detokenize, stop strings). No torch,
# no CUDA: it scales on plain CPU nodes.
# Build from the repository root:  docker build -f docker/frontend.Dockerfile -t nanoserve-frontend .
# Run: mount the same model directory as the worker at /model (tokenizer.json, tokenizer_config.json).

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
    && python /tmp/requirements.py pyproject.toml frontend tracing > /wheels/requirements.txt

FROM ${BASE_IMAGE}
RUN useradd --create-home --uid 10001 --user-group --shell /usr/sbin/nologin nanoserve
COPY docker/healthcheck.py /opt/nanoserve/healthcheck.py
# the compose stack's one-shot `worker-auth` service runs this image to write the worker secret
COPY docker/worker_secret.py /opt/nanoserve/worker_secret.py

# The `frontend` and `tracing` extras only: tokenizers, jinja2 and the OpenTelemetry SDK (imported
# only with --otlp-traces-endpoint) on top of grpcio and protobuf. The wheel holds
# the worker package too (one distribution), but nothing here imports it and torch is not installed.
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
    pip install --no-cache-dir --no-index "$(ls /wheels/nanoserve-*.whl)[frontend,tracing]" \
    && ! python -c "import torch" 2>/dev/null

USER 10001:10001
WORKDIR /home/nanoserve
# the worker-auth volume's mount point (docker-compose.yml), made by the user so that a fresh named
# volume takes its owner and the one-shot service, run as this user, can write the secret there
RUN mkdir -p /home/nanoserve/worker-auth

# Every FrontendConfig field is also a NANOSERVE_FRONTEND_<FIELD> variable. Unlike the loopback defaults
# of a local run, the image binds all interfaces and reads the tokenizer from /model.
ENV NANOSERVE_FRONTEND_HOST=0.0.0.0 \
    NANOSERVE_FRONTEND_PORT=50051 \
    NANOSERVE_FRONTEND_MODEL=/model \
    PYTHONUNBUFFERED=1
EXPOSE 50051

# SERVING once the tokenizer is loaded and the worker answers; NOT_SERVING while the worker is
# unreachable or the frontend drains.
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "/opt/nanoserve/healthcheck.py", "nanoserve.v1.FrontendService", "50051"]

# SIGTERM drains: NOT_SERVING, in-flight calls get --grace-period-s, then exit.
STOPSIGNAL SIGTERM
ENTRYPOINT ["python", "-m", "nanoserve.frontend"]
