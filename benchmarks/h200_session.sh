#!/usr/bin/env bash
# One call on the lent H200 (the device tool runs it from the repository root, wheels carried in .whl):
#   1. the KV transfer path between two worker processes sharing the GPU (gloo through pinned host
#      memory, LLaDA-8B page geometry) -> $OUT/h200-gloo-shared.json, a link profile for sim.links;
#   2. `sangam live --mode 1P1C --gpus 0,0`: Dream-7B, random weights, forced schedule, KV over that path;
#   3. benchmarks.executor_speed for LLaDA-8B and Dream-7B (prefill and decode against the roofline).
# Each step has its own time limit, so what finished comes back when a later one does not.
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl || exit 1
export PYTHONPATH="/tmp/site:$PWD"
# FlashInfer's JIT cache from an earlier call, when one is carried (`tar czf .jit/fi-cache.tgz -C ~/.cache flashinfer`)
[[ -f .jit/fi-cache.tgz ]] && mkdir -p ~/.cache && tar xzf .jit/fi-cache.tgz -C ~/.cache
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv,noheader
python3 -c 'import torch, flashinfer; print("torch", torch.__version__, "flashinfer", flashinfer.__version__)'

step() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
    timeout "$limit" "$@"; local rc=$?; echo "## $name: exit $rc after $((SECONDS - t0)) s"; return $rc; }

step jit 150 python3 -c 'from executor.model.flashinfer_backend import warm_up_kernels as w; print(w("cuda"))'
step measure 90 python3 -m calib.link_fit measure --name h200-gloo-shared --device cuda:0 \
    --transport gloo --repeats 3 --limit 80 --out "$OUT" \
    --note "two worker processes sharing one H200: gloo over loopback TCP, staged through pinned host memory"
step live 230 python3 -m cli.main live --mode 1P1C --gpus 0,0 --gpu h200 --model dream-7b \
    --qps 1 --num-requests 30 --seed 0 --stall-timeout 60 --startup-timeout 150 \
    --out "$OUT/live-1p1c" --iteration-log "$OUT/live-1p1c/iterations.csv" --log-dir /tmp/live-logs \
    || tail -n 25 /tmp/live-logs/*
for model in llada dream; do
    step "speed-$model" 150 python3 -m benchmarks.executor_speed --models "$model" \
        --json "$OUT/speed-$model.json"
done
