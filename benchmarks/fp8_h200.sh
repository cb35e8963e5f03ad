#!/usr/bin/env bash
# FP8 on the lent H200, one call (the device tool runs it from the repository root, wheels carried in .whl:
# flashinfer-python 0.6.3 and apache-tvm-ffi, cp312 manylinux x86_64; .jit optional):
#   1. the FP8 GPU tests (tests/executor/test_fp8_gpu.py): quantizers, scaled GEMM, graphs, accuracy bounds;
#   2. benchmarks.executor_speed, bf16 and FP8 side by side for LLaDA-8B and Dream-7B: decode of 8 and 32
#      items, prefill of 2,048 tokens, each linear layer's GEMM alone, kernel breakdowns at 8 and 32 items;
#   3. benchmarks.fp8_accuracy: FP8 against bf16 on the same random weights.
# Each step has its own time limit, so what finished comes back when a later one does not. Steps can be
# picked: `bash benchmarks/fp8_h200.sh tests speed accuracy` (the default is all three).
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl || exit 1
export PYTHONPATH="/tmp/site:$PWD"
OUT=${OUT:-/tmp/fp8-out}
mkdir -p "$OUT"
# FlashInfer's JIT cache from an earlier call, when one is carried (step jit writes $OUT/fi-cache.tgz)
[[ -f .jit/fi-cache.tgz ]] && mkdir -p ~/.cache && tar xzf .jit/fi-cache.tgz -C ~/.cache
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm,power.draw --format=csv,noheader
python3 -c 'import torch, flashinfer, triton; print("torch", torch.__version__, "flashinfer",
    flashinfer.__version__, "triton", triton.__version__)'

step() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
    timeout "$limit" "$@"; local rc=$?; echo "## $name: exit $rc after $((SECONDS - t0)) s"; return $rc; }
wanted() { local s; for s in "${STEPS[@]}"; do [[ $s == "$1" ]] && return 0; done; return 1; }
STEPS=("$@")
[[ ${#STEPS[@]} -eq 0 ]] && STEPS=(tests speed accuracy)

step jit 150 python3 -c 'from executor.model.flashinfer_backend import warm_up_kernels as w; print(w("cuda"))'
[[ -f .jit/fi-cache.tgz ]] || tar czf "$OUT/fi-cache.tgz" -C ~/.cache flashinfer 2>/dev/null
if wanted tests; then
    step tests 110 python3 -m pytest -m gpu tests/executor/test_fp8_gpu.py -q -x -p no:cacheprovider \
        -o addopts="" 2>&1 | tee "$OUT/tests.txt" | tail -n 30
fi
if wanted speed; then
    step speed 250 python3 -m benchmarks.executor_speed --models llada dream --quantization bf16 fp8 \
        --prefill 2048 --decode 8 32 --profile 8 32 --gemms --json "$OUT/speed.json" 2>&1 \
        | tee "$OUT/speed.txt" | grep -v '^\[profile\]     ' | grep -v '^#   host' | tail -n 60
fi
if wanted accuracy; then
    step accuracy 100 python3 -m benchmarks.fp8_accuracy --prompts 8 --blocks 4 --json "$OUT/accuracy.json" \
        2>&1 | tee "$OUT/accuracy.txt" | tail -n 20
fi
