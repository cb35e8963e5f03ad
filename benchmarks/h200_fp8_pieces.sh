#!/usr/bin/env bash
# Issue 30's eighth round on the lent H200, one call (run from the repository root; carry .whlv and .jit as
# benchmarks/h200_fp8_serve.sh describes): LLaDA-8B with FP8 weights and KV, piecewise graphs on.
#   a/  h200_fp8_serve.sh's jit, profile, testbed and live steps (SEEDS at 1.84 QPS; nvidia-smi logged: smi.csv);
#   speed-pieces.json, speed-eager.json: executor_speed's prefills of 256-4,096 tokens and decodes of 8 items,
#       with the body from piecewise graphs and eagerly (--eager-bodies), for each of SPEEDS (both by default;
#       SPEEDS="" skips them);
#   b/  the GPU tests (h200_fp8_serve.sh's tests step).
# BUDGET_A, SPEED_LIMIT and BUDGET_B bound the three parts (seconds).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
A=$OUT/a; B=$OUT/b; mkdir -p "$A" "$B"
WHEELS=.whlv SMI=1 BUDGET=${BUDGET_A:-330} QPS=1.84 SEEDS="${SEEDS:-14}" STEPS="jit profile testbed live" OUT=$A \
    bash benchmarks/h200_fp8_serve.sh > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD
for M in ${SPEEDS-pieces eager}; do
    F=(); [[ $M == eager ]] && F=(--eager-bodies)
    echo "[$(date -u +%H:%M:%S)] speed $M" >> "$A/steps.log"
    timeout -k 5 "${SPEED_LIMIT:-75}" python3 -m benchmarks.executor_speed --models llada --quantization fp8 \
        --kv-cache-dtype fp8 --prefill 256 1024 2048 4096 --decode 8 "${F[@]}" --json "$OUT/speed-$M.json" \
        >> "$A/steps.log" 2>&1
    echo "[$(date -u +%H:%M:%S)] speed $M: exit $?" >> "$A/steps.log"
done
WHEELS=.whlv BUDGET=${BUDGET_B:-320} STEPS="tests" OUT=$B bash benchmarks/h200_fp8_serve.sh > /dev/null 2>&1
grep -v "^\s*$" "$A/steps.log" | tail -60; tail -6 "$B/steps.log"
