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
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM ${BASE_IMAGE}
COPY --from=wheel /wheels /wheels
# The `frontend` extra only: tokenizers and jinja2 on top of grpcio and protobuf. The wheel holds
# the worker package too (one distribution), but nothing here imports it and torch is not installed.
# hadolint ignore=DL3013
RUN WHEEL="$(ls /wheels/nanoserve-*.whl)" \
    && pip install --no-cache-dir "${WHEEL}[frontend]" \
    && rm -rf /wheels \
    && ! python -c "import torch" 2>/dev/null
COPY docker/healthcheck.py /opt/nanoserve/healthcheck.py

RUN useradd --create-home --uid 10001 --user-group --shell /usr/sbin/nologin nanoserve
USER 10001:10001
WORKDIR /home/nanoserve
# the worker link's secret volume's mount point (docker-compose.yml), made by the user so that a
# fresh named volume takes its owner
RUN mkdir -p /home/nanoserve/link

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
