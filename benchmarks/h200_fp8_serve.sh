#!/usr/bin/env bash
# Issue 30 on the lent H200, one call (run from the repository root; wheels in $WHEELS, .whl by default:
# flashinfer-python 0.6.3, apache-tvm-ffi, simpy, grpcio, grpcio-health-checking, protobuf, sangam serve's
# fastapi, starlette, pydantic, uvicorn, openai and their needs (.whlw, without serve's, keeps a call's carry
# under 64 MiB); .jit/fi-cache.tgz.part-* optional, as fp8_h200.sh writes it, and .jit/triton-cache.tgz, an
# earlier call's ~/.triton, as h200_launch.sh writes it; or, in place of the flashinfer wheel and the cache,
# .jit/flashinfer-aot.tgz as benchmarks/flashinfer_aot.sh makes it). What the wheels still lack, here:
#   pip install --dry-run --no-index --find-links $WHEELS --ignore-installed --target /tmp/x --python-version 3.12 \
#       --only-binary=:all: --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 fastapi openai uvicorn
# (a package it names is missing unless the accelerator machine's image has it).
# LLaDA-8B (and Dream-7B's profile), random weights, FP8 weights and FP8 KV (`--quantization fp8
# --kv-cache-dtype fp8`):
#   jit      FlashInfer's modules for bf16 and FP8 pages;
#   profile  sangam profile -> profile/h200-fp8-kvfp8/llada-8b.* (in profile.tgz);
#   search   sangam fit --profile makes sangam-h200-fp8-call from it (testbed/, in profile.tgz: a shipped
#            name is never replaced, so it is renamed sangam-h200-fp8 where it ships); sangam search of
#            one colocated H200 at p99_e2el_s=20 (the README's SLO) on it with --kv-cache-dtype fp8
#            (search-fp8.csv) and, beside it, on sangam-h200 (the shipped bf16 profile; search-bf16.csv);
#   live     the live half of a held-out sangam validate: sangam live of the FP8 run at 80% of the FP8
#            capacity, REQUESTS (150) requests for each of SEEDS (13), iteration log ->
#            validate/seedS/live-qpsQ/ (in validate.tgz): one seed's log can refit the profile
#            (sangam profile --from-log) and another seed's run stays held out;
#   dream    sangam profile of Dream-7B the same way -> profile/h200-fp8-kvfp8/dream-7b.* (in profile.tgz);
#   speed    benchmarks.executor_speed of SPEED_MODELS ("llada" by default), bf16 and FP8, then FP8 over FP8 pages
#            (speed.json, speed-kv8.json; kernel sums at 8 and 32 items); not in the default STEPS, nor DRY;
#   pages    attention over FP8 pages: benchmarks.kv_attention_speed --page-sweep (FlashInfer's fa2 and
#            Fp8PageAttention, one layer, LLaDA and Dream at 8 and 32 items), then executor_speed of both
#            models over FP8 pages with the decode graphs on Fp8PageAttention (pages.json) and on fa2
#            (pages-fa2.json); not in the default STEPS, nor DRY;
#   prefill  prefill attention over the forward's own K/V rows: executor_speed of SPEED_MODELS' FP8 prefills
#            over FP8 pages through FlashInfer's fa2 (--fa2-prefill; prefill-fa2.json: the speed step's rows
#            have the Triton kernel), then benchmarks.prefill_attention_speed --sweep (one layer, by kernel
#            and Triton configuration; no fa3, cuDNN or SDPA flash); not in the default STEPS, nor DRY;
#   serve    sangam serve --quantization fp8 --kv-cache-dtype fp8, a streamed chat through the openai
#            client (benchmarks/checkpoint_serve.py chat): chunks, time to the first chunk, finish_reason;
#   tests    tests/executor/test_fp8_kv_gpu.py, test_fp8_attention_gpu.py, test_flashinfer_gpu.py,
#            test_piecewise_graphs_gpu.py and test_prefill_kernel_gpu.py (-m gpu), then test_fp8_gpu.py if TESTS_ALL=1; within TESTS_LIMIT
#            seconds (300: the first pytest process on a fresh machine spends minutes loading FlashInfer's
#            modules; 150 ran out in two calls of the eighth round, while a warm machine took 43 s).
# STEPS (default: all but speed, pages and prefill) names the steps to run, in this order: jit pages prefill profile testbed
# search live speed dream serve tests (the tests last: one that times out leaves processes behind that would disturb a
# measurement). QPS sets the live runs' rate instead of 80% of the searched FP8 capacity (search may then be
# left out), so a call can repeat earlier live runs (SEEDS="14 13" QPS=1.52 STEPS="jit live").
# Each step's limit is cut to what is left of BUDGET seconds (a step with under 20 s left is skipped), so
# the summary always prints. At most 8 files come back (the device tool's limit), so ask for steps whose
# files fit: steps.log (everything, the summary at its end), tests.xml, profile.tgz, search-fp8.csv,
# search-bf16.csv, validate.tgz, speed.json, speed-kv8.json, pages.json, pages-fa2.json, prefill-fa2.json,
# chat.json, and,
# when no cache was carried, the JIT cache's parts (fi-cache.tgz.part-*, two at 15 MB;
# then the summary alone, summary.txt, is left out). A carried cache is not written back: carry one made
# by the same code, or the modules it lacks are built in the jit step each call.
# SEEDS may name a seed twice: its second run goes to validate/seedS-again/ (how far one live run repeats).
# SMI=1 logs the card's clocks, power, temperature and throttle reasons every 500 ms to smi.csv.
# DRY=1: the same sequence on this CPU machine: tiny-llada CPU workers, the profile through
# benchmarks.dry_profile (the tiny twin, 1 repeat), 8 requests, GPU tests collected and skipped.
# Then, here: the simulator half of validate and the shipped testbed (docs/executor-performance.md).
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
DRY=${DRY:-0}; SMI=${SMI:-0}; BUDGET=${BUDGET:-550}; TESTS_ALL=${TESTS_ALL:-0}; SEEDS=${SEEDS:-13}; WHEELS=${WHEELS:-.whl}
STEPS=${STEPS:-jit profile testbed search live dream serve tests}; QPS=${QPS:-}; SPEED_MODELS=${SPEED_MODELS:-llada}
OUT=${OUT:-/tmp/h200-fp8-serve-out}
SLO=p99_e2el_s=20
FP8=(--quantization fp8 --kv-cache-dtype fp8)
if [[ $DRY == 1 ]]; then
    PROFILE=(python3 -m benchmarks.dry_profile --repeats 1); REQUESTS=8
    PLACE=(--workers 1 --model tiny-llada --pages 4096); SEARCH_N=(-n 400)
else
    PROFILE=(python3 -m cli.main profile); REQUESTS=${REQUESTS:-150}
    PLACE=(--gpus 1 --model llada-8b); SEARCH_N=()
fi
mkdir -p "$OUT"
LOG="$OUT/steps.log"; : > "$LOG"
RESULTS=()
say() { echo "[$(date -u +%H:%M:%S) +$SECONDS s] $*" | tee -a "$LOG"; }
wanted() { [[ " $STEPS " == *" $1 "* ]]; }
step() {
    local name=$1 limit=$2; shift 2; local t0=$SECONDS left=$((BUDGET - 15 - SECONDS))
    wanted "${name%%-*}" || return 0
    if (( left < 20 )); then
        say "skip $name: $left s left of BUDGET=$BUDGET"; RESULTS+=("$name: skipped"); return 124
    fi
    (( limit > left )) && limit=$left
    say "start $name (limit $limit s)"
    timeout -k 10 "$limit" "$@" 2>&1 | tee -a "$LOG"; local rc=${PIPESTATUS[0]}
    say "end $name: exit $rc after $((SECONDS - t0)) s"; RESULTS+=("$name: exit $rc after $((SECONDS - t0)) s")
    return "$rc"
}

say "h200_fp8_serve: DRY=$DRY BUDGET=$BUDGET OUT=$OUT"
if [[ -d $WHEELS && $DRY != 1 ]]; then  # the wheels are for the device (cp312)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        "$WHEELS"/*.whl || exit 1
    # FlashInfer without its sources, with the executor's modules compiled (AOT, loaded as they are): a call's
    # whole carry fits in 64 MiB (benchmarks/flashinfer_aot.sh makes it from an earlier call's JIT cache)
    [[ -f .jit/flashinfer-aot.tgz ]] && tar xzf .jit/flashinfer-aot.tgz -C /tmp/site
    export PYTHONPATH="/tmp/site:$PWD"
else
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
if [[ $DRY != 1 ]]; then
    nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv,noheader | tee -a "$LOG"
    # the card's clocks, power, temperature and throttle reasons through the call, every 500 ms
    [[ $SMI == 1 ]] && nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,utilization.gpu,temperature.gpu,clocks_event_reasons.active \
        --format=csv -lms 500 > "$OUT/smi.csv" 2>&1 &
    [[ $SMI == 1 ]] && SMI_PID=$!
    JIT_PARTS=$(ls .jit/fi-cache.tgz.part-* 2>/dev/null)
    [[ -n $JIT_PARTS ]] && mkdir -p ~/.cache && cat $JIT_PARTS | tar xz -C ~/.cache
    [[ -f .jit/triton-cache.tgz ]] && tar xzf .jit/triton-cache.tgz -C ~  # our Triton kernels, compiled
    step jit 150 python3 -c 'import torch
from executor.model.flashinfer_backend import warm_up_kernels as w
print(w("cuda"), w("cuda", kv_dtype=torch.float8_e4m3fn))'
    # the modules the jit step built, when none were carried (without the step there is nothing to keep)
    wanted jit && [[ -z $JIT_PARTS && ! -f .jit/flashinfer-aot.tgz ]] && tar cz -C ~/.cache flashinfer 2>/dev/null \
        | split -b 15m - "$OUT/fi-cache.tgz.part-"
fi

SPEED=(python3 -m benchmarks.executor_speed --prefill 1024 2048 4096 --decode 8 32 --profile 8 32)
if [[ $DRY != 1 ]]; then
    step pages 120 python3 -m benchmarks.kv_attention_speed --items 8 32 --page-sweep
    PAGES=("${SPEED[@]}" --models llada dream --quantization fp8 --kv-cache-dtype fp8)
    step pages-kernel 120 "${PAGES[@]}" --json "$OUT/pages.json"
    step pages-fa2 120 "${PAGES[@]}" --fa2-pages --json "$OUT/pages-fa2.json"
fi

if [[ $DRY != 1 ]]; then
    step prefill 150 python3 -m benchmarks.executor_speed --models $SPEED_MODELS --prefill 1024 2048 4096 --decode 8 \
        --no-graphs "${FP8[@]}" --fa2-prefill --json "$OUT/prefill-fa2.json"
    step prefill-kernels 150 python3 -m benchmarks.prefill_attention_speed --sweep --skip fa3 cudnn flash fp8
fi

step profile 150 "${PROFILE[@]}" --model llada-8b --gpu h200 "${FP8[@]}" --out "$OUT/profile"
DATA="$OUT/profile/h200-fp8-kvfp8"
[[ -f $DATA/llada-8b.csv ]] && step testbed 30 python3 -m cli.main fit --profile "$DATA" \
    --testbed sangam-h200 --name sangam-h200-fp8-call --out "$OUT/testbed"  # a shipped name is never replaced
capacity() { python3 -c 'import csv, sys; print(next(csv.DictReader(open(sys.argv[1])))["max_qps_under_slo"])' "$1"; }
if wanted search; then
    # the bf16 capacity (shipped profile) beside the FP8 one: a CPU job, run while the FP8 one runs
    SEARCH=(python3 -m cli.main search --model llada-8b --gpus 1 --layouts colocated --slo "$SLO" "${SEARCH_N[@]}")
    timeout 120 "${SEARCH[@]}" --testbed sangam-h200 --out "$OUT/search-bf16.csv" > /tmp/search-bf16.log 2>&1 &
    BF16=$!
    [[ -f $OUT/testbed/sangam-h200-fp8-call.json ]] && step search 90 "${SEARCH[@]}" \
        --testbed "$OUT/testbed/sangam-h200-fp8-call.json" --kv-cache-dtype fp8 --out "$OUT/search-fp8.csv"
    wait "$BF16"; cat /tmp/search-bf16.log >> "$LOG"
fi
if [[ -z $QPS && -f $OUT/search-fp8.csv ]]; then
    QPS=$(python3 -c 'import sys; print(f"{round(0.8 * float(sys.argv[1]), 2):g}")' "$(capacity "$OUT/search-fp8.csv")")
    [[ $DRY == 1 && $QPS == 0 ]] && QPS=1  # the tiny CPU twin's profile may meet no rate at all
    say "FP8 capacity $(capacity "$OUT/search-fp8.csv") QPS; the live run at 80%: $QPS QPS"
fi
if [[ -n $QPS ]]; then
    for SEED in $SEEDS; do
        RUN="$OUT/validate/seed$SEED/live-qps$QPS"
        [[ -e $RUN ]] && RUN="$OUT/validate/seed$SEED-again/live-qps$QPS"  # a seed repeated: its run again
        step "live-seed$SEED" 220 python3 -m cli.main live --mode colocated "${PLACE[@]}" --gpu h200 "${FP8[@]}" \
            --seed "$SEED" --num-requests "$REQUESTS" --qps "$QPS" --out "$RUN" --iteration-log "$RUN/iterations.csv"
    done
fi

if [[ $DRY != 1 ]]; then
    step speed 300 "${SPEED[@]}" --models $SPEED_MODELS --quantization bf16 fp8 --json "$OUT/speed.json"
    step speed-kv8 200 "${SPEED[@]}" --models $SPEED_MODELS --quantization fp8 --kv-cache-dtype fp8 \
        --json "$OUT/speed-kv8.json"
fi

DREAM=(--model dream-7b)  # DRY=1: dry_profile runs its tiny twin
step dream 150 "${PROFILE[@]}" "${DREAM[@]}" --gpu h200 "${FP8[@]}" --out "$OUT/profile"

step serve 120 python3 -m benchmarks.checkpoint_serve chat --max-tokens 64 128 --log /tmp/serve-fp8.log \
    --json "$OUT/chat.json" -- "${PLACE[@]}" --gpu h200 "${FP8[@]}" --mask-len 128

GPU_TESTS=(tests/executor/test_fp8_kv_gpu.py tests/executor/test_fp8_attention_gpu.py tests/executor/test_flashinfer_gpu.py
    tests/executor/test_piecewise_graphs_gpu.py tests/executor/test_prefill_kernel_gpu.py)
[[ $TESTS_ALL == 1 ]] && GPU_TESTS+=(tests/executor/test_fp8_gpu.py)
step tests "${TESTS_LIMIT:-300}" python3 -m pytest -m gpu "${GPU_TESTS[@]}" -q -rs -p no:cacheprovider -o addopts="" \
    --junit-xml=/tmp/fp8-tests.xml
wanted tests && [[ -f /tmp/fp8-tests.xml ]] && cp /tmp/fp8-tests.xml "$OUT/tests.xml"

say "summary"
{
    printf '%s\n' "${RESULTS[@]}"
    [[ -f $OUT/tests.xml ]] && python3 -c 'import sys, xml.etree.ElementTree as T
s = T.parse(sys.argv[1]).getroot().find("testsuite")
print("GPU tests:", {k: s.get(k) for k in ("tests", "failures", "errors", "skipped", "time")})' "$OUT/tests.xml"
    grep -h "MAPE" "$LOG"
    [[ -f $OUT/search-bf16.csv ]] && echo "capacity bf16 (sangam-h200): $(capacity "$OUT/search-bf16.csv") QPS at $SLO"
    [[ -f $OUT/search-fp8.csv ]] && echo "capacity FP8 (sangam-h200-fp8-call, FP8 KV): $(capacity "$OUT/search-fp8.csv") QPS at $SLO"
    for RUN in "$OUT"/validate/seed*/live-qps$QPS; do
        SEED=$(basename "$(dirname "$RUN")"); SEED=${SEED#seed}
        [[ -n $QPS && -f $RUN/summary.json ]] && python3 -c 'import json, sys
s = json.load(open(sys.argv[1]))
done, mean, p99, pages = s["completed"], s["mean_e2el_ms"] / 1e3, s["p99_e2el_ms"] / 1e3, s["config"]["kv_pages"]
print(f"live FP8 at {sys.argv[2]} QPS, seed {sys.argv[3]}: {done} requests, mean e2e {mean:.2f} s, "
      f"p99 {p99:.2f} s, KV pages {pages}")' "$RUN/summary.json" "$QPS" "$SEED"
    done
    [[ -f $OUT/chat.json ]] && python3 -c 'import json, sys
c = json.load(open(sys.argv[1]))
for t in c["turns"]:
    chunks, first, finish = t["chunks"], t["ttft_ms"], t["finish_reason"]
    print(f"serve chat turn: {chunks} chunks, the first after {first:.1f} ms, finish_reason {finish}")
ready = c.get("ready_s")
print(f"serve ready after {ready} s; " + ("ok" if c["ok"] else "FAILED"))' \
        "$OUT/chat.json"
} 2>&1 | tee "$OUT/summary.txt" | tee -a "$LOG"
PARTS=(); for d in profile testbed; do [[ -d $OUT/$d ]] && PARTS+=("$d"); done
(( ${#PARTS[@]} )) && tar czf "$OUT/profile.tgz" -C "$OUT" "${PARTS[@]}" && rm -rf "$OUT/profile" "$OUT/testbed"
[[ -d $OUT/validate ]] && tar czf "$OUT/validate.tgz" -C "$OUT" validate && rm -rf "$OUT/validate"
[[ -n $(ls "$OUT"/fi-cache.tgz.part-* 2>/dev/null) ]] && rm -f "$OUT/summary.txt"  # the summary ends steps.log
[[ -n ${SMI_PID:-} ]] && kill "$SMI_PID"
say "done after $SECONDS s"
ls -la "$OUT" | tee -a "$LOG"
