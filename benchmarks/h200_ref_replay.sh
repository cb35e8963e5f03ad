#!/usr/bin/env bash
# One call on the lent H200 (the device tool runs it from the repository root): the reference
# implementation's own server (launcher, scheduler, one colocated worker) and `sangam live` replay the
# same trace files at two loads with the same forced forwards per block, LLaDA-8B random bf16 weights;
# then the comparison (benchmarks/ref_replay.py) and the reference's per-iteration report RPC timed per
# batch size (benchmarks/refpeer/report_rpc_timer.py). Everything lands in $OUT: steps.log has each
# step's start, end, exit status and seconds; a step that overruns its limit is killed, the next runs.
# Carried, ignored: .whl (flashinfer-python 0.6.3, apache-tvm-ffi, ddsketch, grpcio-health-checking,
# simpy, ...), .peer (the reference's tarball), .jit (optional: an earlier call's JIT caches).
# Environment: LOADS (QPS:REQUESTS,...; 0.5:30,1.5:60), D (forwards per block, dividing 32; 8),
# SEED (7), PAGES (KV pages on both sides; 8192), STEPS (any of: reference rpc ours; all three),
# READY_LIMIT (seconds for the reference to start; 330), BUDGET (seconds the whole call may take; 580:
# a step's limit is cut to what is left, and a step with less than 20 s left is skipped, so the summary
# is always printed).
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
LOADS=${LOADS:-0.5:30,1.5:60}; D=${D:-8}; SEED=${SEED:-7}; PAGES=${PAGES:-8192}
STEPS=${STEPS:-reference rpc ours}; READY_LIMIT=${READY_LIMIT:-330}; BUDGET=${BUDGET:-580}
OUT=${OUT:-/tmp/ref-replay-out}; mkdir -p "$OUT"
REPO=$PWD; REF=/tmp/ref/sangam-reference/src; CKPT=/tmp/llada-8b-random; PORT=50151; QUOTA=$((32 / D))
REFPATH="/tmp/site:$REF:$REPO/benchmarks/refpeer/shim"  # with the transformers-5 shims: its model code
PLAINPATH="/tmp/site:$REF"  # its stubs only: the replay client and the report timer
LOG="$OUT/steps.log"
say() { echo "[$(date -u +%H:%M:%S) +$SECONDS s] $*" | tee -a "$LOG"; }
step() {
    local name=$1 limit=$2; shift 2; local t0=$SECONDS left=$((BUDGET - 10 - SECONDS))
    if (( left < 20 )); then say "skip $name: $left s left of BUDGET=$BUDGET"; return 124; fi
    (( limit > left )) && limit=$left
    say "start $name (limit $limit s)"
    timeout -k 10 "$limit" "$@" 2>&1 | tee -a "$LOG"; local rc=${PIPESTATUS[0]}
    say "end $name: exit $rc after $((SECONDS - t0)) s"; return "$rc"
}
trace_facts() {  # name, requests and last arrival (whole seconds) of a trace file
    name=$(basename "$1" .csv); name=${name#trace-}
    n=$(($(wc -l < "$1") - 1)); span=$(tail -n 1 "$1" | cut -d, -f1 | cut -d. -f1)
}

say "install wheels, unpack the reference"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl || exit 1
export PYTHONPATH="/tmp/site:$REPO"
mkdir -p /tmp/ref ~/.cache && tar xzf .peer/sangam-reference-*.tar.gz -C /tmp/ref || exit 1
[[ -f .jit/jit-cache.tgz ]] && tar xzf .jit/jit-cache.tgz -C ~/.cache
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv,noheader | tee -a "$LOG"
python3 -m benchmarks.ref_replay traces --out "$OUT/traces" --loads "$LOADS" --seed "$SEED" --mask-len 512 \
    | tee -a "$LOG"

if [[ $STEPS == *reference* ]]; then
    step checkpoint 150 env PYTHONPATH="$REFPATH" python3 benchmarks/refpeer/write_checkpoint.py \
        --out "$CKPT" --device cuda --seed "$SEED"
    say "start the reference's launcher (log: ref-server.log)"
    # from /tmp, and -P: the working directory (ours) is not on its sys.path; exec: $! is the launcher
    (cd /tmp && exec env PYTHONPATH="$REFPATH" SANGAM_REF_SHIM_LOG=1 HF_HUB_OFFLINE=1 \
        python3 -P -m sangam.entrypoints.launch --mode colocated --model "$CKPT" --gpus 0 \
        --scheduler-port $PORT --kv-page-size 16 --block-length 32 --max-tokens-per-iteration 1024 \
        --max-gen-len 512 --kv-max-pages "$PAGES" --max-batch-size 64 --metrics-output-dir /tmp/ref-metrics) \
        > "$OUT/ref-server.log" 2>&1 &
    LAUNCHER=$!
    first=1
    for trace in "$OUT"/traces/trace-qps*.csv; do
        trace_facts "$trace"
        extra=(); limit=$((span + 90))
        if [[ $first == 1 ]]; then
            extra=(--wait-ready "$READY_LIMIT" --watch-pid "$LAUNCHER" --warmup 2)
            limit=$((limit + READY_LIMIT))
        fi
        step "reference-$name ($n requests)" "$limit" env PYTHONPATH="$PLAINPATH" python3 \
            benchmarks/refpeer/replay_client.py --trace "$trace" --port $PORT --quota "$QUOTA" \
            --seed "$SEED" --json "$OUT/ref-$name.json" "${extra[@]}"
        first=0
        kill -0 "$LAUNCHER" 2>/dev/null || { say "the reference's launcher is gone"; break; }
    done
    say "stop the reference's launcher"
    kill -TERM "$LAUNCHER" 2>/dev/null  # it stops its scheduler and worker (SIGTERM, then SIGKILL)
    for _ in $(seq 30); do kill -0 "$LAUNCHER" 2>/dev/null || break; sleep 1; done
    if kill -0 "$LAUNCHER" 2>/dev/null; then pkill -KILL -P "$LAUNCHER"; kill -KILL "$LAUNCHER"; fi
    wait "$LAUNCHER" 2>/dev/null; sleep 2
    grep -iE "error|traceback|exception|shims|ready|registered" "$OUT/ref-server.log" | head -n 20 \
        | tee -a "$LOG"
    tail -n 15 "$OUT/ref-server.log"
    if (( $(stat -c %s "$OUT/ref-server.log") > 20000000 )); then  # keep its two ends only
        { head -n 3000 "$OUT/ref-server.log"; echo "[... cut ...]"; tail -n 3000 "$OUT/ref-server.log"; } \
            > /tmp/ref-server.short && mv /tmp/ref-server.short "$OUT/ref-server.log"
    fi
    rm -rf "$CKPT"
    nvidia-smi --query-gpu=memory.used --format=csv,noheader | tee -a "$LOG"
fi

if [[ $STEPS == *rpc* ]]; then
    step report-rpc 90 env PYTHONPATH="$PLAINPATH" python3 benchmarks/refpeer/report_rpc_timer.py \
        --batch-sizes 1,2,4,8,16,32,64 --seq-lens 1024,1536 --json "$OUT/report-rpc.json"
fi

if [[ $STEPS == *ours* ]]; then
    for trace in "$OUT"/traces/trace-qps*.csv; do
        trace_facts "$trace"
        step "ours-$name ($n requests)" $((span + 120)) python3 -m cli.main live --gpus 1 --gpu h200 \
            --model llada-8b --trace "$trace" -n "$n" --qps "${name#qps}" --mask-len 512 --pages "$PAGES" \
            --progress "fixed:$D" --seed "$SEED" --startup-timeout 100 --stall-timeout 60 \
            --out "$OUT/ours-$name" --log-dir "/tmp/live-logs-$name"
        python3 -m benchmarks.ref_replay compare --reference "$OUT" --ours "$OUT" --json "$OUT/compare.json" \
            > /dev/null 2>&1  # so far, in case the call is cut
    done
fi

say "compare"
python3 -m benchmarks.ref_replay compare --reference "$OUT" --ours "$OUT" --json "$OUT/compare.json" \
    | tee "$OUT/compare.md" | tee -a "$LOG"
say "done"
ls -la "$OUT"
