#!/usr/bin/env bash
# FP8 on the lent H200, one call (the device tool runs it from the repository root, wheels carried in .whl:
# flashinfer-python 0.6.3 and apache-tvm-ffi, cp312 manylinux x86_64; .jit optional):
#   1. the FP8 GPU tests (tests/executor/test_fp8_gpu.py: quantizers, scaled GEMM, graphs, accuracy bounds;
#      test_fp8_kv_gpu.py: attention over FP8 pages) and FlashInfer's (test_flashinfer_gpu.py);
#   2. benchmarks.executor_speed, bf16 and FP8 side by side for LLaDA-8B and Dream-7B: decode of 8 and 32
#      items, prefill of 2,048 tokens, kernel breakdowns at 8 and 32 items (GEMMS=1: each linear layer's
#      GEMM alone too);
#   3. benchmarks.fp8_accuracy: FP8 against bf16 on the same random weights;
#   4. attention: benchmarks.kv_attention_speed, attention alone over bf16 and FP8 pages;
#   5. speed-kv8: FP8 weights over an FP8 KV cache (executor_speed --kv-cache-dtype fp8), with breakdowns;
#   6. fa3: kv_attention_speed's probe of FlashInfer's fa3 kernels (their JIT build takes minutes).
# Each step has its own time limit, so what finished comes back when a later one does not. Steps can be
# picked: `bash benchmarks/fp8_h200.sh tests speed accuracy` (the default is those three).
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl || exit 1
export PYTHONPATH="/tmp/site:$PWD"
OUT=${OUT:-/tmp/fp8-out}
mkdir -p "$OUT"
# FlashInfer's JIT cache from an earlier call, when one is carried (`cache`, after the attention step,
# writes it in 15 MB parts, $OUT/fi-cache.tgz.part-*, small enough to come back)
JIT_PARTS=$(ls .jit/fi-cache.tgz.part-* 2>/dev/null)
[[ -n $JIT_PARTS ]] && mkdir -p ~/.cache && cat $JIT_PARTS | tar xz -C ~/.cache
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm,power.draw --format=csv,noheader
python3 -c 'import torch, flashinfer, triton; print("torch", torch.__version__, "flashinfer",
    flashinfer.__version__, "triton", triton.__version__)'

step() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
    timeout "$limit" "$@"; local rc=$?; echo "## $name: exit $rc after $((SECONDS - t0)) s"; return $rc; }
wanted() { local s; for s in "${STEPS[@]}"; do [[ $s == "$1" ]] && return 0; done; return 1; }
STEPS=("$@")
[[ ${#STEPS[@]} -eq 0 ]] && STEPS=(tests speed accuracy)

step jit 150 python3 -c 'from executor.model.flashinfer_backend import warm_up_kernels as w; print(w("cuda"))'
cache() { tar cz -C ~/.cache flashinfer 2>/dev/null | split -b 15m - "$OUT/fi-cache.tgz.part-"; }
if wanted tests; then
    step tests 150 python3 -m pytest -m gpu tests/executor/test_fp8_gpu.py tests/executor/test_fp8_kv_gpu.py \
        tests/executor/test_flashinfer_gpu.py -q -p no:cacheprovider \
        -o addopts="" 2>&1 | tee "$OUT/tests.txt" | tail -n 30
fi
if wanted speed; then
    step speed 250 python3 -m benchmarks.executor_speed --models llada dream --quantization bf16 fp8 \
        --prefill 2048 --decode 8 32 --profile 8 32 ${GEMMS:+--gemms} --json "$OUT/speed.json" 2>&1 \
        | tee "$OUT/speed.txt" | grep -v '^\[profile\]     ' | grep -v '^#   host' | tail -n 60
fi
if wanted accuracy; then
    step accuracy 100 python3 -m benchmarks.fp8_accuracy --prompts 8 --blocks 4 --json "$OUT/accuracy.json" \
        2>&1 | tee "$OUT/accuracy.txt" | tail -n 20
fi
if wanted attention; then
    step attention 150 python3 -m benchmarks.kv_attention_speed 2>&1 | tee "$OUT/attention.txt"
fi
cache  # after the attention step, which compiles the fp16 and FP8-page modules
if wanted speed-kv8; then
    step speed-kv8 200 python3 -m benchmarks.executor_speed --models llada dream --quantization fp8 \
        --kv-cache-dtype fp8 --prefill 2048 --decode 8 32 --profile 8 32 --json "$OUT/speed-kv8.json" 2>&1 \
        | tee "$OUT/speed-kv8.txt" | grep -v '^\[profile\]     ' | grep -v '^#   host' | tail -n 40
fi
if wanted fa3; then
    step fa3 300 python3 -m benchmarks.kv_attention_speed --fa3 2>&1 | tee "$OUT/fa3.txt"
fi
