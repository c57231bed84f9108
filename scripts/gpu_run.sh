#!/usr/bin/env bash
# One call on the GPU machine: GPU tests, kernel and engine benchmarks, then a short table.
# Usage: bash scripts/gpu_run.sh [quick|full|tp]   (tp needs two GPUs)   (logs go to $OUT or ./gpu-logs)
set -u
mode=${1:-full}
out=${OUT:-gpu-logs}; mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
echo "commit ${NANOSERVE_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}" | tee -a "$out/gpu.txt"
bench="python -m nanoserve.benchmarks.engine --json"
step() {  # step NAME TIMEOUT CMD...: run, keep the log, never stop the script
  local name=$1 limit=$2; shift 2
  echo "=== $name: $*"
  timeout "$limit" "$@" 2>&1 | tee "$out/$name.log" | grep -vE '^\s*$' | tail -n 40
}
# quick: tests + 0.6B figures; full: + kernel sweep + 8B latency; tp: TP tests + 8B at tensor-parallel 1 and 2
[ "$mode" != tp ] && step gpu_tests 420 python -m pytest -q tests/gpu -p no:cacheprovider -rA --ignore=tests/gpu/test_tp_gpu.py
# tensor parallel in its own process: a collective that hangs must not take the rest down
[ "$mode" = tp ] && step gpu_tp_tests 240 python -m pytest -q tests/gpu/test_tp_gpu.py -p no:cacheprovider -rA
[ "$mode" = full ] && step kernel_bench 90 python -m nanoserve.benchmarks.attention
[ "$mode" != tp ] && step bench_06b 240 $bench throughput latency prefill profile --shape qwen3-0.6b --breakdown
if [ "$mode" = full ]; then
  step bench_06b_eager 60 $bench latency --shape qwen3-0.6b --enforce-eager
  step bench_8b 90 $bench latency --shape qwen3-8b
fi
if [ "$mode" = tp ]; then
  step allreduce 120 python -m nanoserve.benchmarks.allreduce
  step bench_8b_tp1 200 $bench throughput latency profile --shape qwen3-8b --tensor-parallel-size 1
  step bench_8b_tp2 200 $bench latency --shape qwen3-8b --tensor-parallel-size 2 --decode-lookahead off
  step bench_8b_tp2_lookahead 200 $bench throughput latency profile --shape qwen3-8b --tensor-parallel-size 2 --decode-lookahead on
fi
python - "$out" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
rows = []
for log in sorted(out.glob("*.log")):
    for line in log.read_text().splitlines():
        if line.startswith("{"):
            rows.append(json.loads(line))
        elif line.startswith("[gpu]") or " passed" in line or " failed" in line:
            print(f"{log.stem:<16} {line.strip()}")
print(f"\n{'bench':<11} {'model':<11} tp  figures")
for r in rows:
    figs = {k: v for k, v in r.items() if k not in ("bench", "model", "tp", "top_kernels_us_per_step")}
    print(f"{r['bench']:<11} {r.get('model', '-'):<11} {r.get('tp', r.get('world_size', '-')):<3} {figs}")
(out / "results.json").write_text(json.dumps(rows, indent=1))
PY
