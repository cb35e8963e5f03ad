#!/usr/bin/env bash
# One call on the lent H200 (the device tool runs it from the repository root): the reference
# implementation's worker iteration over `sangam profile`'s grid (benchmarks/peer_profile.py), and ours
# over the same grid in the same call, so the ratio per shape is measured side by side.
# Carried, ignored: .whl (flashinfer-python 0.6.3, apache-tvm-ffi, simpy, grpcio-health-checking, ddsketch),
# .peer (the reference's tarball from ../shared/peers and its tools/ref_probe.py), .jit (an earlier call's
# FlashInfer and Triton JIT caches, optional). STEPS picks the steps: reference, ours, cache. MODEL:
# llada-8b (default) or dream-7b (the reference's own DreamModel, built by peer_profile.py; its KV pool
# defaults to the reference's 49152 Dream pages, and the transformers-5 shims of benchmarks/refpeer/shim
# give its rotary embedding the "default" RoPE that transformers 5 dropped). OURS_FLAGS: more flags for our
# profile, such as "--quantization fp8 --kv-cache-dtype fp8" (issue 30: our FP8 iteration beside its bf16).
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
STEPS=${STEPS:-reference ours cache}
MODEL=${MODEL:-llada-8b}
if [[ $MODEL == dream-7b ]]; then PAGES=${PAGES:-49152}; SHIM=":$PWD/benchmarks/refpeer/shim"; else SHIM=""; fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    ${WHEELS:-.whl}/*.whl || exit 1
export PYTHONPATH="/tmp/site:$PWD"
mkdir -p /tmp/ref ~/.cache && tar xzf .peer/sangam-reference-*.tar.gz -C /tmp/ref
[[ -f .jit/jit-cache.tgz ]] && tar xzf .jit/jit-cache.tgz -C ~/.cache
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv,noheader
step() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
    timeout "$limit" "$@"; local rc=$?; echo "## $name: exit $rc after $((SECONDS - t0)) s"; return $rc; }

python3 -m benchmarks.peer_profile shapes --model "$MODEL" --json /tmp/shapes.json --pages "${PAGES:-13169}"
if [[ $STEPS == *reference* ]]; then
    step reference "${REF_LIMIT:-480}" env PYTHONPATH="/tmp/site:/tmp/ref/sangam-reference/src$SHIM" \
        python3 benchmarks/peer_profile.py probe --model "$MODEL" --probe .peer/ref_probe.py \
        --shapes /tmp/shapes.json -- \
        --json "$OUT/probe.json" --kv-max-pages "$(( ${PAGES:-13169} + 2 ))" --warmup 1 --iters 5 \
        --skip-breakdown --time-budget-s "$(( ${REF_LIMIT:-480} - 20 ))" > "$OUT/reference.log" 2>&1
    tail -n 5 "$OUT/reference.log"
    python3 -m benchmarks.peer_profile store --model "$MODEL" --probe-json "$OUT/probe.json" --out "$OUT/reference"
fi
if [[ $STEPS == *ours* ]]; then
    step ours "${OURS_LIMIT:-240}" python3 -m cli.main profile --model "$MODEL" --gpu h200 ${OURS_FLAGS:-} \
        --out /tmp/ours > "$OUT/ours.log" 2>&1
    tail -n 3 "$OUT/ours.log"; cp /tmp/ours/h200*/"$MODEL.csv" "$OUT/ours.csv"
    cp /tmp/ours/h200*/"$MODEL.meta.json" "$OUT/ours.meta.json"
fi
if [[ $STEPS == *cache* ]]; then
    [[ $STEPS == *ours* ]] || step jit 150 python3 -c 'from executor.model.flashinfer_backend import warm_up_kernels as w; print(w("cuda"))'
    tar czf "$OUT/jit-cache.tgz" -C ~/.cache $(cd ~/.cache && ls -d flashinfer triton tvm-ffi 2>/dev/null)
    ls -la "$OUT"; du -sh ~/.cache/*
fi
