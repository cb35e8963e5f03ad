#!/usr/bin/env bash
# Issue 30 on the lent H200, one call: do the fused FP8 kernels (norm with quantization, one K/V store) take
# the eager FP8 forward off the host's launch floor? Run from the repository root, wheels in $WHEELS (.whlw:
# flashinfer-python 0.6.3, apache-tvm-ffi, simpy, grpcio, protobuf), .jit/fi-cache.tgz.part-* optional, and
# .jit/triton-cache.tgz optional (an earlier call's ~/.triton), and .old/ optional: the tree before the
# fusions (`git archive REV executor sangam`, with this launch_cost.py in .old/benchmarks/), measured in the
# same call. Steps (arguments pick them; the default is all but bf16 and speed):
#   launch   benchmarks.launch_cost --ops --cprofile 25: FP8 weights and KV, this tree, .old's, this tree
#            with Triton's own launches, this tree again (the first run's reproducibility);
#   bf16     launch_cost of bf16 weights and KV (this tree);
#   speed    benchmarks.executor_speed, LLaDA-8B FP8 over FP8 KV (issue 30's item-4 shapes), kernel breakdown
#            at 8 items;
#   tests    the FP8 GPU tests (test_fp8_gpu.py, test_fp8_kv_gpu.py: the fused kernels against torch), last,
#            so that nothing they leave running meets a measurement;
# then the Triton cache this call compiled ($OUT/triton-cache.tgz), to carry in a later call.
set -u
export PYTHONUNBUFFERED=1
WHEELS=${WHEELS:-.whlw}; OUT=${OUT:-/tmp/h200-launch-out}
mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd); LOG="$OUT/steps.log"; : > "$LOG"  # absolute: .old's step cds
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "$WHEELS"/*.whl || exit 1
SITE=/tmp/site
JIT_PARTS=$(ls .jit/fi-cache.tgz.part-* 2>/dev/null)
[[ -n $JIT_PARTS ]] && mkdir -p ~/.cache && cat $JIT_PARTS | tar xz -C ~/.cache
[[ -f .jit/triton-cache.tgz ]] && tar xzf .jit/triton-cache.tgz -C ~
STEPS=("$@"); [[ ${#STEPS[@]} -eq 0 ]] && STEPS=(launch tests)
wanted() { local s; for s in "${STEPS[@]}"; do [[ $s == "$1" ]] && return 0; done; return 1; }
step() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
    echo "## start $name" | tee -a "$LOG"
    timeout -k 5 "$limit" "$@" 2>&1 | tee -a "$LOG"; local rc=${PIPESTATUS[0]}
    echo "## $name: exit $rc after $((SECONDS - t0)) s" | tee -a "$LOG"; }
export PYTHONPATH="$SITE:$PWD"
python3 -c 'import torch, flashinfer, triton; print("torch", torch.__version__, "flashinfer",
    flashinfer.__version__, "triton", triton.__version__)' 2>&1 | tee -a "$LOG"
if wanted launch; then
    step launch-new 100 python3 -m benchmarks.launch_cost --ops --cprofile 25
    [[ -d .old ]] && (cd .old && PYTHONPATH="$SITE:$PWD" step launch-old 100 \
        python3 -m benchmarks.launch_cost --ops --cprofile 25)
    step launch-triton 80 python3 -m benchmarks.launch_cost --triton-launch
    step launch-new-again 80 python3 -m benchmarks.launch_cost
fi
wanted bf16 && step launch-bf16 80 python3 -m benchmarks.launch_cost --quantization bf16 --kv-cache-dtype auto
wanted speed && step speed 150 python3 -m benchmarks.executor_speed --models llada --quantization fp8 \
    --kv-cache-dtype fp8 --prefill 2048 --decode 8 32 --profile 8 --json "$OUT/speed-kv8.json"
wanted tests && step tests 240 python3 -m pytest -m gpu tests/executor/test_fp8_gpu.py \
    tests/executor/test_fp8_kv_gpu.py -q -p no:cacheprovider -o addopts="" -x --durations=8
[[ -d ~/.triton ]] && tar czf "$OUT/triton-cache.tgz" -C ~ .triton
echo "## done after $SECONDS s" | tee -a "$LOG"
