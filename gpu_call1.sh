set -u
export NANOSERVE_COMMIT=e256838 GPU_RUN_BUDGET_S=560
AB_VARIANTS="now fp8 now" GPU_TESTS_K="unseen or greedy or fp8 or sample" bash scripts/gpu_run.sh timeline ab retest features 2>&1 | tail -n 170
cp gpu-logs/timeline.log gpu-logs/gpu_retest.log gpu-logs/sampling_filters.log gpu-logs/summary.txt $OUT/ 2>/dev/null
