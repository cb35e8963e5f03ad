#!/usr/bin/env bash
# FlashInfer for the lent H200 in fewer bytes: the flashinfer-python wheel's Python package without the
# headers its builds include (CUTLASS, its own, spdlog), plus the executor's modules as an earlier call compiled them, laid
# out as FlashInfer's ahead-of-time modules (flashinfer/data/aot/NAME/NAME.so: loaded as they are, never
# rebuilt). h200_fp8_serve.sh unpacks it into its wheels' folder, so a call's carry fits in 64 MiB.
#   bash benchmarks/flashinfer_aot.sh WHEEL 'CACHE_PARTS...' OUT.tgz
# It keeps its CUDA sources (data/csrc, ~1 MB packed): FlashInfer generates a module's sources from them
# before it looks for the compiled module.
# WHEEL: flashinfer_python-*.whl; CACHE_PARTS: fi-cache.tgz.part-* as h200_fp8_serve.sh's jit step writes
# them (~/.cache/flashinfer of a call that built the modules). A module the cache lacks cannot be built
# from this package: carry the whole wheel and the cache instead.
set -euo pipefail
WHEEL=$1; PARTS=$2; TARGET=$(realpath -m "$3")
WORK=$(mktemp -d); trap 'rm -rf "$WORK"' EXIT
python3 -m pip install -q --no-deps --no-compile --target "$WORK/site" "$WHEEL"
# data/csrc stays: FlashInfer generates a module's sources from its templates before it looks for the module
rm -rf "$WORK"/site/flashinfer/data/{cutlass,include,spdlog} "$WORK"/site/bin "$WORK"/site/build_*.py
mkdir -p "$WORK/cache" && cat $PARTS | tar xz -C "$WORK/cache"
for SO in "$WORK"/cache/flashinfer/*/*/cached_ops/*/*.so; do
    NAME=$(basename "$(dirname "$SO")")
    mkdir -p "$WORK/site/flashinfer/data/aot/$NAME" && cp "$SO" "$WORK/site/flashinfer/data/aot/$NAME/"
done
tar czf "$TARGET" -C "$WORK/site" flashinfer "$(basename "$WORK"/site/flashinfer_python-*.dist-info)"
ls -l "$TARGET"
