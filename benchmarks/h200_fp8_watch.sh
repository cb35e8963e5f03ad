#!/usr/bin/env bash
# Issue 30 on the lent H200, one call (run from the repository root; carry .whl (or a smaller folder of wheels
# named in WHEELS), .jit, .peer as
# benchmarks/h200_peer.sh and h200_fp8_serve.sh describe):
#   watch  an FP8 live run of LLaDA-8B (SEED, REQUESTS requests at QPS, iteration log) under watch: the GPU's
#          clocks, power and throttle reasons every 500 ms (nvidia-smi), every thread's CPU time every 100 ms
#          (benchmarks/proc_watch.py), and the worker's host time per step and its garbage collections
#          (benchmarks/hostwatch) -> watch.tgz. It tells a host that starved the GPU (the mixed iterations
#          of seed 14 that took twice their price) from a GPU that slowed.
#   peer   our FP8 profile and the reference's bf16 one in the same call (benchmarks/h200_peer.sh with
#          OURS_FLAGS) -> peer.tgz, with the reference's time cut to what is left of BUDGET seconds.
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
BUDGET=${BUDGET:-590}; SEED=${SEED:-14}; QPS=${QPS:-1.44}; REQUESTS=${REQUESTS:-60}; STEPS=${STEPS:-watch peer}
FINAL=$OUT
LOG="$FINAL/steps.log"; : > "$LOG"
say() { echo "[$(date -u +%H:%M:%S) +$SECONDS s] $*" | tee -a "$LOG"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    ${WHEELS:-.whl}/*.whl || exit 1
export PYTHONPATH="/tmp/site:$PWD"
mkdir -p ~/.cache && cat .jit/fi-cache.tgz.part-* | tar xz -C ~/.cache
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm,power.limit --format=csv,noheader | tee -a "$LOG"
{ cat /sys/fs/cgroup/cpu.max; nproc; } 2>&1 | tee -a "$LOG"

if [[ $STEPS == *watch* ]]; then
    W=/tmp/watch; RUN=$W/live; mkdir -p "$W"
    nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,utilization.gpu,temperature.gpu,clocks_event_reasons.active \
        --format=csv -lms 500 > "$W/smi.csv" 2>&1 &
    SMI=$!
    python3 -m benchmarks.proc_watch --out "$W/proc.csv" &
    PROC=$!
    say "start watch: live seed $SEED at $QPS QPS"
    mkdir -p "$W/host"
    HOSTWATCH_DIR="$W/host" PYTHONPATH="$PWD/benchmarks/hostwatch:$PYTHONPATH" \
        timeout -k 10 240 python3 -m cli.main live --mode colocated --gpus 1 --model llada-8b --gpu h200 \
        --quantization fp8 --kv-cache-dtype fp8 --seed "$SEED" --num-requests "$REQUESTS" --qps "$QPS" \
        --out "$RUN" --iteration-log "$RUN/iterations.csv" 2>&1 | tail -n 25 | tee -a "$LOG"
    say "end watch"
    sleep 1; kill "$SMI" "$PROC" 2>/dev/null
    tar czf "$FINAL/watch.tgz" -C /tmp watch
fi

if [[ $STEPS == *peer* ]]; then
    LEFT=$((BUDGET - SECONDS - 30)); REF=$((LEFT - 110))
    say "start peer: reference limit $REF s, ours 100 s"
    mkdir -p /tmp/peer
    OUT=/tmp/peer STEPS="reference ours" REF_LIMIT=$REF OURS_LIMIT=100 \
        OURS_FLAGS="--quantization fp8 --kv-cache-dtype fp8" bash benchmarks/h200_peer.sh 2>&1 | tee -a "$LOG"
    [[ -f /tmp/peer/ours.csv && -f /tmp/peer/reference/llada-8b.csv ]] && python3 -m benchmarks.peer_profile \
        compare --ours /tmp/peer/ours.csv --reference /tmp/peer/reference/llada-8b.csv 2>&1 | tee -a "$LOG"
    tar czf "$FINAL/peer.tgz" -C /tmp peer
fi
say "done"
ls -la "$FINAL" | tee -a "$LOG"
