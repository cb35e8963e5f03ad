#!/usr/bin/env bash
# Calls on the lent H200 (issue 32, item 1): the reference implementation's own loops, timed by a shim
# on its PYTHONPATH (benchmarks/refpeer/shim/ref_timing.py; nothing in its tree edited), LLaDA-8B random
# bf16 weights. PARTS picks what a call runs: `colocated` (its colocated launcher, one worker: B requests
# at once, B in BATCHES, at 8 and 16 forwards per block), `hybrid` (its hybrid launcher, one prefill and one
# decode worker both on GPU 0, KV group switched to gloo by the shim: a prefill-only burst, then a trace)
# and `ours` (`sangam live --mode 1P1D --gpus 0,0` on the same trace). Launchers of one call start at the
# same time, so their loads and captures overlap, and are measured one after the other. Run the colocated
# part alone (the default) and `PARTS="hybrid ours"` in a second call: with all three in one call the
# colocated worker ran out of GPU memory from B = 4 (2026-12-03). The analysis (benchmarks/ref_loops.py)
# runs at the end. $OUT gets steps.log, summary.json, summary.md, ref-loops-logs.tgz (the shim's logs,
# the phase marks, the servers' logs, the client results, the plans) and ours-1p1d.tgz.
# Carried, ignored: .whl and .peer as for h200_ref_replay.sh; .jit (optional) an earlier JIT cache.
# Environment: PARTS (any of: colocated hybrid ours; colocated), BATCHES (1,2,4,8,16,32,64), FORWARDS ("8 16"), TAU (the colocated launcher's
# --max-tokens-per-iteration: 8192, so that B requests reach decode together), COLO_PAGES (4096),
# HYB_PAGES (per hybrid worker; 2048), GRAPHS (captured decode batch sizes; 1,2,4,8,16,32,64),
# READY_LIMIT (330), BUDGET (585: each step's limit is cut to what is left, a step with less than 20 s
# is skipped, so the summary always prints).
# `bash benchmarks/h200_ref_loops.sh check` (CPU, here): every wrapped attribute of the reference exists with
# the expected parameters (plain and installed), both launchers' flags parse in its own parser, the plans
# are written and the replay client builds every request. REF (the reference's src) and REFDEPS (seaborn,
# ddsketch, where the environment lacks them) locate it there.
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
MODE=${1:-run}
BATCHES=${BATCHES:-1,2,4,8,16,32,64}; FORWARDS=${FORWARDS:-8 16}; TAU=${TAU:-8192}; SEED=${SEED:-7}
COLO_PAGES=${COLO_PAGES:-4096}; HYB_PAGES=${HYB_PAGES:-2048}; GRAPHS=${GRAPHS:-1,2,4,8,16,32,64}
READY_LIMIT=${READY_LIMIT:-330}; BUDGET=${BUDGET:-585}; HYB_MASK=256; HYB_D=8
PARTS=${PARTS:-colocated}
OUT=${OUT:-/tmp/ref-loops-out}; mkdir -p "$OUT"
REPO=$PWD; REF=${REF:-/tmp/ref/sangam-reference/src}; CKPT=/tmp/llada-8b-random; W=/tmp/ref-loops
SHIM="$REPO/benchmarks/refpeer/shim"; REFPATH="/tmp/site:$REF:${REFDEPS:+$REFDEPS:}$SHIM"
PLAINPATH="/tmp/site:$REF"; LOG="$OUT/steps.log"; MASK_ID=126336
COLO_PORT=50151; HYB_PORT=50161
COLO_ARGS=(--mode colocated --gpus 0 --scheduler-port $COLO_PORT --base-worker-port 20100 --master-port 29500
    --kv-page-size 16 --block-length 32 --max-tokens-per-iteration "$TAU" --max-gen-len 512 --mask-id $MASK_ID
    --kv-max-pages "$COLO_PAGES" --max-batch-size 64 --cuda-graph-batch-sizes "$GRAPHS"
    --metrics-output-dir /tmp/ref-metrics-colocated)
HYB_ARGS=(--mode hybrid --prefill-gpus 0 --hybrid-colocated-gpus 0 --no-enable-hybrid-prefill-overflow
    --scheduler-port $HYB_PORT --base-worker-port 20200 --master-port 29510 --kv-page-size 16 --block-length 32
    --max-tokens-per-iteration 1024 --max-gen-len $HYB_MASK --mask-id $MASK_ID --kv-max-pages "$HYB_PAGES"
    --max-batch-size 64 --cuda-graph-batch-sizes "$GRAPHS" --metrics-output-dir /tmp/ref-metrics-hybrid)
PLAN_ARGS=(--batches "$BATCHES" --hybrid-mask $HYB_MASK --seed "$SEED")

say() { echo "[$(date -u +%H:%M:%S) +$SECONDS s] $*" | tee -a "$LOG"; }
step() {
    local name=$1 limit=$2; shift 2; local t0=$SECONDS left=$((BUDGET - 15 - SECONDS))
    if (( left < 20 )); then say "skip $name: $left s left of BUDGET=$BUDGET"; return 124; fi
    (( limit > left )) && limit=$left
    say "start $name (limit $limit s)"
    timeout -k 5 "$limit" "$@" 2>&1 | tee -a "$LOG"; local rc=${PIPESTATUS[0]}
    say "end $name: exit $rc after $((SECONDS - t0)) s"; return "$rc"
}
mark() {  # phase marks on the shim's clock (CLOCK_MONOTONIC, shared by every process)
    python3 -c 'import json, sys, time; print(json.dumps({"name": sys.argv[1], "edge": sys.argv[2], "t": time.monotonic_ns()}))' \
        "$1" "$2" >> "$W/phases.jsonl"
}
CLIENT=(env PYTHONPATH="$PLAINPATH" python3 benchmarks/refpeer/replay_client.py --seed "$SEED" --timeout 120)
flags_parse() {  # both launchers' flags through the reference's own parser
    (cd /tmp && env PYTHONPATH="$REFPATH" python3 -P -c '
import argparse, sys
from sangam.engine.launch_config import add_engine_launch_args, engine_launch_config_from_namespace
sep = sys.argv.index("--and")
for argv in (sys.argv[1:sep], sys.argv[sep + 1:]):
    parser = argparse.ArgumentParser()
    add_engine_launch_args(parser, include_metrics_output_dir=True)
    cfg = engine_launch_config_from_namespace(parser.parse_args(argv + ["--model", "/nonexistent"]))
    print(f"flags ok: {cfg.mode}, pages {cfg.kv_max_pages}, tau {cfg.max_tokens_per_iteration}, "
          f"mask {cfg.max_gen_len}, graphs {cfg.cuda_graph_batch_sizes}, overflow {cfg.enable_hybrid_prefill_overflow}")
' "${COLO_ARGS[@]}" --and "${HYB_ARGS[@]}")
}
shim_check() {  # plain, then installed from the environment with the gloo switch
    (cd /tmp && env PYTHONPATH="$REFPATH" python3 -P -m ref_timing check | tail -n 1 && \
        env PYTHONPATH="$REFPATH" SANGAM_REF_TIMING_DIR=/tmp/ref-timing-check SANGAM_REF_KV_GLOO=1 \
        python3 -P -m ref_timing check | tail -n 2)
}
stop() {  # launcher pid: its own SIGTERM handling stops its scheduler and workers
    kill -TERM "$1" 2>/dev/null
    for _ in $(seq 20); do kill -0 "$1" 2>/dev/null || break; sleep 1; done
    if kill -0 "$1" 2>/dev/null; then pkill -KILL -P "$1"; kill -KILL "$1"; fi
    wait "$1" 2>/dev/null
}

rm -rf "$W"; mkdir -p "$W/clients" "$W/colocated" "$W/hybrid"
if [[ $MODE == check ]]; then
    export PYTHONPATH="$REPO"
    shim_check || exit 1
    flags_parse || exit 1
    python3 -m benchmarks.ref_loops plans --out "$W/plans" "${PLAN_ARGS[@]}" || exit 1
    for plan in "$W"/plans/*.csv; do
        env PYTHONPATH="$PLAINPATH" python3 benchmarks/refpeer/replay_client.py --trace "$plan" --quota 4 \
            --dry-run || exit 1
    done
    echo "check: done"; exit 0
fi

say "install wheels, unpack the reference"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl || exit 1
export PYTHONPATH="/tmp/site:$REPO"
mkdir -p /tmp/ref ~/.cache && tar xzf .peer/sangam-reference-*.tar.gz -C /tmp/ref || exit 1
[[ -f .jit/jit-cache.tgz ]] && tar xzf .jit/jit-cache.tgz -C ~/.cache
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv,noheader | tee -a "$LOG"
shim_check 2>&1 | tee -a "$LOG"; flags_parse 2>&1 | tee -a "$LOG"
python3 -m benchmarks.ref_loops plans --out "$W/plans" "${PLAN_ARGS[@]}" | tee -a "$LOG"
step checkpoint 150 env PYTHONPATH="$REFPATH" python3 benchmarks/refpeer/write_checkpoint.py \
    --out "$CKPT" --device cuda --seed "$SEED" || exit 1

say "start the launchers of: $PARTS (logs: colocated-server.log, hybrid-server.log)"
COLO=""
if [[ $PARTS == *colocated* ]]; then
    (cd /tmp && exec env PYTHONPATH="$REFPATH" SANGAM_REF_SHIM_LOG=1 HF_HUB_OFFLINE=1 SANGAM_REF_TIMING_DIR="$W/colocated" \
        python3 -P -m sangam.entrypoints.launch --model "$CKPT" "${COLO_ARGS[@]}") > "$W/colocated-server.log" 2>&1 &
    COLO=$!
fi
HYB=""
if [[ $PARTS == *hybrid* ]]; then
    (cd /tmp && exec env PYTHONPATH="$REFPATH" SANGAM_REF_SHIM_LOG=1 HF_HUB_OFFLINE=1 SANGAM_REF_TIMING_DIR="$W/hybrid" \
        SANGAM_REF_KV_GLOO=1 python3 -P -m sangam.entrypoints.launch --model "$CKPT" "${HYB_ARGS[@]}") \
        > "$W/hybrid-server.log" 2>&1 &
    HYB=$!
fi

first=(--wait-ready "$READY_LIMIT" --watch-pid "$COLO" --warmup 2)
[[ -n $COLO ]] && for d in $FORWARDS; do
    for b in ${BATCHES//,/ }; do
        kill -0 "$COLO" 2>/dev/null || { say "the colocated launcher is gone"; break 2; }
        limit=60; (( ${#first[@]} )) && limit=$((READY_LIMIT + 60))
        mark "batch-B$b-D$d" start
        step "colocated B=$b D=$d" "$limit" "${CLIENT[@]}" --trace "$W/plans/batch-B$b.csv" --quota $((32 / d)) \
            --json "$W/clients/colocated-B$b-D$d.json" --port $COLO_PORT "${first[@]}"
        mark "batch-B$b-D$d" end
        first=()
    done
done
[[ -n $COLO ]] && { say "stop the colocated launcher"; stop "$COLO"; }
nvidia-smi --query-gpu=memory.used --format=csv,noheader | tee -a "$LOG"

if [[ -n $HYB ]] && kill -0 "$HYB" 2>/dev/null; then
    mark burst start
    step "hybrid burst" $((READY_LIMIT + 60)) "${CLIENT[@]}" --trace "$W/plans/burst.csv" --quota 32 \
        --json "$W/clients/hybrid-burst.json" --port $HYB_PORT --wait-ready "$READY_LIMIT" --watch-pid "$HYB" --warmup 1
    mark burst end
    mark "hybrid-D$HYB_D" start
    step "hybrid trace" 150 "${CLIENT[@]}" --trace "$W/plans/hybrid.csv" --quota $((32 / HYB_D)) \
        --json "$W/clients/hybrid-trace.json" --port $HYB_PORT
    mark "hybrid-D$HYB_D" end
elif [[ -n $HYB ]]; then
    say "the hybrid launcher is gone"
fi
[[ -n $HYB ]] && { say "stop the hybrid launcher"; stop "$HYB"; }
grep -ihE "error|traceback|refpeer shims|Captured|Registered|Initialized" "$W"/*-server.log | head -n 30 | tee -a "$LOG"
rm -rf "$CKPT"

say "analyze"
python3 -m benchmarks.ref_loops analyze --logs "$W" --json "$OUT/summary.json" --meta "date=$(date -u +%F)" \
    "gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)" "commit=$(git rev-parse --short HEAD 2>/dev/null)" \
    "batches=$BATCHES" "forwards=$FORWARDS" "tau=$TAU" "colo_pages=$COLO_PAGES" "hyb_pages=$HYB_PAGES" \
    "graphs=$GRAPHS" "hybrid_mask=$HYB_MASK" "hybrid_forwards=$HYB_D" "kv_group=gloo through pinned host memory" \
    | tee "$OUT/summary.md" | tee -a "$LOG"
for f in "$W"/*-server.log; do  # keep the two ends of a long one
    if (( $(stat -c %s "$f") > 5000000 )); then
        { head -n 2000 "$f"; echo "[... cut ...]"; tail -n 2000 "$f"; } > "$f.short" && mv "$f.short" "$f"
    fi
done
tar czf "$OUT/ref-loops-logs.tgz" -C "$W" . && say "logs: $(du -h "$OUT/ref-loops-logs.tgz" | cut -f1)"

trace_n=$(($(wc -l < "$W/plans/hybrid.csv") - 1))
[[ $PARTS == *ours* ]] && step "ours 1P1D" 200 python3 -m cli.main live --mode 1P1D --gpus 0,0 --gpu h200 --model llada-8b \
    --trace "$W/plans/hybrid.csv" -n "$trace_n" --qps 1 --mask-len $HYB_MASK --pages "$HYB_PAGES" \
    --progress "fixed:$HYB_D" --seed "$SEED" --startup-timeout 120 --stall-timeout 60 \
    --out /tmp/ours-1p1d --log-dir /tmp/ours-1p1d-logs
[[ -d /tmp/ours-1p1d ]] && tar czf "$OUT/ours-1p1d.tgz" -C /tmp ours-1p1d ours-1p1d-logs 2>/dev/null
say "done"
ls -la "$OUT"
