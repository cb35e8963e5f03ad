#!/usr/bin/env bash
# Calibration calls on the lent H200 (run from the repository root, wheels carried in .whl), for LLaDA-8B:
#   bash benchmarks/h200_calibrate.sh STEP...   with STEP one of
#     graphs      the GPU tests of FlashInfer and the decode CUDA graphs (pytest -m gpu)
#     profile[:M] `sangam profile --model M --gpu h200` (M: llada-8b, the default, or dream-7b)
#                 -> $OUT/profile/h200/M.*
#     speed       benchmarks.executor_speed for LLaDA-8B -> $OUT/speed-llada.json
#     live:QPS[:N] the live half of `sangam validate --mode colocated` at QPS, N requests (300) ->
#                 $OUT/validate/live-qpsQPS/ (the simulator half runs here, with --live-results)
# Each step has its own time limit, so what finished comes back when a later one does not.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl || exit 1
export PYTHONPATH="/tmp/site:$PWD"
# FlashInfer's JIT cache from an earlier call, when one is carried (`tar czf .jit/fi-cache.tgz -C ~/.cache flashinfer`)
[[ -f .jit/fi-cache.tgz ]] && mkdir -p ~/.cache && tar xzf .jit/fi-cache.tgz -C ~/.cache
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv,noheader

step() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
    timeout "$limit" "$@"; local rc=$?; echo "## $name: exit $rc after $((SECONDS - t0)) s"; return $rc; }

step jit 150 python3 -c 'from executor.model.flashinfer_backend import warm_up_kernels as w; print(w("cuda"))'
for what in "$@"; do
    case $what in
        graphs) step graphs 240 python3 -m pytest -q -m gpu -p no:cacheprovider \
            tests/executor/test_flashinfer_gpu.py || exit 1 ;;
        profile|profile:*)
            model=${what#profile}; model=${model#:}; model=${model:-llada-8b}
            step "profile $model" 240 python3 -m cli.main profile --model "$model" --gpu h200 \
                --out "$OUT/profile" ;;
        speed) step speed 240 python3 -m benchmarks.executor_speed --models llada --json "$OUT/speed-llada.json" ;;
        live:*)
            spec=${what#live:}; n=300; [[ $spec == *:* ]] && n=${spec#*:} && spec=${spec%%:*}
            qps=$(awk "BEGIN { print $spec + 0 }")  # 1.0 -> 1: the directory `sangam validate` reads
            step "live $qps" 590 python3 -m cli.main live --mode colocated --model llada-8b --gpu h200 \
                --gpus 1 --seed 0 --num-requests "$n" --qps "$qps" --out "$OUT/validate/live-qps$qps" \
                --iteration-log "$OUT/validate/live-qps$qps/iterations.csv" ;;
        *) echo "unknown step $what"; exit 2 ;;
    esac
done
