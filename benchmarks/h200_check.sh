#!/usr/bin/env bash
# One call on the lent H200 after a round of changes: the GPU-marked tests, then benchmarks.serve_bench
# (LLaDA-8B, random weights, one GPU) so the HTTP path's cost is measured at a GPU's latencies.
# Carried, ignored: .whl (flashinfer-python 0.6.3, apache-tvm-ffi, simpy, grpcio-health-checking, and
# sangam serve's fastapi, starlette, pydantic, pydantic-core, uvicorn, typing-inspection, annotated-types,
# opentelemetry-api; uvloop and httptools optional: uvicorn falls back to asyncio and h11), .jit
# (FlashInfer's JIT cache from an earlier call, optional).
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl || exit 1
export PYTHONPATH="/tmp/site:$PWD"
mkdir -p ~/.cache && [[ -f .jit/jit-cache.tgz ]] && tar xzf .jit/jit-cache.tgz -C ~/.cache
step() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
    timeout "$limit" "$@"; local rc=$?; echo "## $name: exit $rc after $((SECONDS - t0)) s"; return $rc; }

step gpu-tests "${TEST_LIMIT:-240}" python3 -m pytest -m gpu -q -x -p no:cacheprovider \
    --ignore tests/executor/test_serve_checkpoint.py tests/executor tests/test_live_gpu.py > "$OUT/gpu-tests.log" 2>&1
tail -n 15 "$OUT/gpu-tests.log"
step serve-bench "${BENCH_LIMIT:-300}" python3 -m benchmarks.serve_bench --num-prompts "${PROMPTS:-40}" \
    --request-rate 1 --out /tmp/bench -- --gpus 1 > "$OUT/serve-bench.log" 2>&1
tail -n 25 "$OUT/serve-bench.log"
cp /tmp/bench/serve_bench.json "$OUT/" 2>/dev/null
