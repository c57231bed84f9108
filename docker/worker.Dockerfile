# nanoserve worker: the GPU half (scheduler, paged KV cache, Qwen3 model, CUDA graphs, sampler).
# Build from the repository root:  docker build -f docker/worker.Dockerfile -t nanoserve-worker .
# Run: mount a Hugging Face Qwen3 directory at /model and give it GPUs (see docker-compose.yml).

# The official PyTorch runtime image: torch 2.11 and triton 3.6 (the versions the GPU tests run)
# with their CUDA libraries, so `pip install .[worker]` finds torch satisfied. CUDA 12.8 needs an
# NVIDIA driver >= 570; with a driver >= 580, --build-arg BASE_IMAGE=...2.11.0-cuda13.0-cudnn9-runtime.
ARG BASE_IMAGE=pytorch/pytorch:2.11.0-cuda12.8-cudnn9-runtime

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
    && python /tmp/requirements.py pyproject.toml worker tracing > /wheels/requirements.txt

FROM ${BASE_IMAGE}
# Triton compiles a small host-side launcher per kernel signature with the system C compiler at
# run time; the runtime image has none, so the first Triton kernel would fail without gcc.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
# Non-root with a numeric id (Kubernetes' runAsNonRoot checks the number) and a home of its
# own: Triton and torch keep their kernel caches under ~/.triton and ~/.cache.
RUN useradd --create-home --uid 10001 --user-group --shell /usr/sbin/nologin nanoserve
COPY docker/healthcheck.py /opt/nanoserve/healthcheck.py

# The dependencies in a layer of their own, keyed on their list alone (copied, not the sources),
# so that a source change reinstalls only the wheel below: seconds, not minutes. With the GPU base
# torch and triton are the image's own (the requirement is met); docker/wheelhouse (empty in the
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
    pip install --no-cache-dir --no-index "$(ls /wheels/nanoserve-*.whl)[worker,tracing]"

USER 10001:10001
WORKDIR /home/nanoserve
# the compile-cache volume's mount point (docker-compose.yml), made by the user so that a fresh
# named volume takes its owner
RUN mkdir -p /home/nanoserve/.cache/nanoserve/compile

# Every WorkerConfig field is also a NANOSERVE_WORKER_<FIELD> variable. Unlike the loopback defaults
# of a local run, the image binds all interfaces (other containers dial it) and reads /model.
ENV NANOSERVE_WORKER_HOST=0.0.0.0 \
    NANOSERVE_WORKER_PORT=50061 \
    NANOSERVE_WORKER_MODEL=/model \
    PYTHONUNBUFFERED=1
EXPOSE 50061

# Loading weights, sizing the KV cache and capturing CUDA graphs take minutes on a large model;
# health stays NOT_SERVING until the engine is ready and again while draining.
HEALTHCHECK --interval=10s --timeout=5s --start-period=600s --retries=3 \
    CMD ["python", "/opt/nanoserve/healthcheck.py", "nanoserve.v1.WorkerService", "50061"]

# SIGTERM drains: NOT_SERVING, in-flight streams get --grace-period-s, then exit 0.
STOPSIGNAL SIGTERM
ENTRYPOINT ["python", "-m", "nanoserve.worker"]
