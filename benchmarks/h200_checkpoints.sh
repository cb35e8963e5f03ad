#!/usr/bin/env bash
# Checkpoints as downloaded, at full size, on the lent H200 in one call (the device tool runs it from the
# repository root; issue 28 item 7): a random-weight LLaDA-8B and Dream-7B checkpoint, each written in its
# Hugging Face repository's layout and loaded, timed (benchmarks/checkpoint_layouts.py), then served by
# `sangam serve --weights DIR --trust-remote-code` and chatted with through the openai client, streamed:
# time to /health, TTFT, the gaps between chunks, finish reasons (benchmarks/checkpoint_serve.py); and the
# bf16 GPU logits against float32 CPU logits on a small checkpoint of each family
# (benchmarks/checkpoint_logits.py). FlashInfer's JIT compiles on the CPUs while the first checkpoint is
# written on the GPU. Everything lands in $OUT: steps.log (each step's start, end, exit status, seconds and
# output) and results.json (every step's part; until the summary runs, the parts are in $OUT/parts), and
# fi-cache.tgz (FlashInfer's JIT cache, to carry as .jit/ next time) when none was carried. A step that
# overruns its limit is killed and the next runs; the summary is always printed.
# Carried, ignored: .whl (flashinfer-python 0.6.3, apache-tvm-ffi, grpcio, grpcio-health-checking, fastapi,
# uvicorn, httptools, openai and their needs), .jit (optional: fi-cache.tgz of an earlier call).
# Environment: TINY=1 is the dry run for a CPU machine (tiny checkpoints, a CPU worker, bf16 against float32
# both on the CPU); FAMILIES (llada dream); TURNS (max_tokens of each chat turn; 64 256 64 256, with TINY=1
# 32 64); BUDGET (seconds the whole call may take; 480: a step's limit is cut to what is left, and a step
# with less than 20 s left is skipped); CKPTS (where the checkpoints go, each removed once served;
# /tmp/sangam-checkpoints).
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
TINY=${TINY:-0}; FAMILIES=${FAMILIES:-llada dream}; BUDGET=${BUDGET:-480}
OUT=${OUT:-/tmp/h200-checkpoints-out}; CKPTS=${CKPTS:-/tmp/sangam-checkpoints}
if [[ $TINY == 1 ]]; then  # a CPU forward over the real vocabulary is slow: shorter turns
    SIZE=tiny; DEVICE=cpu; PLACE=(--workers 1 --pages 512); TURNS=${TURNS:-32 64}
else
    SIZE=full; DEVICE=cuda; PLACE=(--gpus 1 --gpu h200); TURNS=${TURNS:-64 256 64 256}
fi
longest=0; for t in $TURNS; do (( t > longest )) && longest=$t; done
SERVE=("${PLACE[@]}" --mask-len $(((longest + 31) / 32 * 32)))  # the longest turn's, in whole blocks
mkdir -p "$OUT/parts" "$CKPTS"
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

say "h200_checkpoints: TINY=$TINY SIZE=$SIZE DEVICE=$DEVICE FAMILIES='$FAMILIES' TURNS='$TURNS' BUDGET=$BUDGET"
if [[ -d .whl ]]; then
    say "install wheels"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl || exit 1
    export PYTHONPATH="/tmp/site:$PWD"
else
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
df -h "$CKPTS" | tail -n 1 | tee -a "$LOG"
JIT=""
if [[ $DEVICE == cuda ]]; then
    nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv,noheader | tee -a "$LOG"
    [[ -f .jit/fi-cache.tgz ]] && mkdir -p ~/.cache && tar xzf .jit/fi-cache.tgz -C ~/.cache
    step jit 240 python3 -c 'from executor.model.flashinfer_backend import warm_up_kernels as w; print(w("cuda"))' &
    JIT=$!
fi

parts=(); logits=0
for family in $FAMILIES; do
    dir="$CKPTS/$family"
    parts+=("$OUT/parts/write-$family.json")
    step "write-$family" 200 python3 -m benchmarks.checkpoint_serve write --family "$family" --size "$SIZE" \
        --device "$DEVICE" --dir "$dir" --json "$OUT/parts/write-$family.json"
    if [[ $logits == 0 ]]; then  # once, after the first write
        logits=1
        if [[ -n $JIT ]]; then
            wait "$JIT"
            [[ -f .jit/fi-cache.tgz ]] || tar czf "$OUT/fi-cache.tgz" -C ~/.cache flashinfer 2>/dev/null
        fi
        parts+=("$OUT/parts/logits.json")
        step logits 180 python3 -m benchmarks.checkpoint_logits --device "$DEVICE" --json "$OUT/parts/logits.json"
    fi
    parts+=("$OUT/parts/chat-$family.json")
    if [[ -f $dir/model.safetensors.index.json ]]; then
        # shellcheck disable=SC2086  # TURNS is a list of numbers
        step "chat-$family" 240 python3 -m benchmarks.checkpoint_serve chat --dir "$dir" --max-tokens $TURNS \
            --log "/tmp/serve-$family.log" --json "$OUT/parts/chat-$family.json" -- "${SERVE[@]}"
    fi
    rm -rf "$dir"
done

say "summary"
python3 -m benchmarks.checkpoint_serve summary "${parts[@]}" --json "$OUT/results.json" 2>&1 | tee -a "$LOG"
[[ ${PIPESTATUS[0]} == 0 && -f $OUT/results.json ]] && rm -rf "$OUT/parts"
say "done after $SECONDS s"
ls -la "$OUT"
