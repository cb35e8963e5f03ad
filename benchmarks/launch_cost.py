"""Host launch time against GPU time of eager forwards (issue 30: eager FP8 iterations are bound by the host's
launches). Run on the accelerator machine, from the repository root (FlashInfer and Triton installed):

    python -m benchmarks.launch_cost [--model llada|dream] [--quantization bf16|fp8]
        [--kv-cache-dtype auto|fp8] [--ops]

Full-size random weights. For each shape (one prefill of S tokens; a prefill of 1,024 tokens with B decodes
riding along; B eager decodes), each over 1,819 cached positions as `executor_speed`'s decodes, it prints the
median over repeats of

- `host ms`: from the call of `ModelRunner.forward` to its return, the GPU idle at the start (as after a
  worker's sampling step): the time the host takes to launch the forward;
- `gpu ms`: CUDA-event time of the same call, as the live worker's iteration log records it;
- `host/gpu`: over 0.9 the GPU waits for the host (launch-bound).

`--ops` adds the host time of one launch of each operation an eager FP8 layer makes, at 256 rows: the median
over 200 back-to-back launches, the GPU kept busy so that none waits on it. `--cprofile N` prints the N
functions with the most host time over 10 eager forwards of 8 decodes (cProfile). `--triton-launch` launches
the Triton kernels through Triton's own `kernel[grid](...)` (`fp8_kernels.COMPILED_LAUNCH = False`). Only
stdout is written.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time
from collections.abc import Callable

import torch

from executor.model import fp8
from executor.model.config import Family, full_size
from executor.model.flashinfer_backend import make_backend
from executor.model.forward import ModelRunner
from executor.model.kv_cache import PagedKVCache
from executor.model.loading import random_model
from executor.model.microbatch import ForwardItem, Phase
from executor.model.prefill_attention import make_prefill_attention
from sangam.hardware import pages_for
from sangam.kv import PagePool

PROMPT, MASKS = 795, 1024  # executor_speed's decode context: 1,819 cached positions
SHAPES = ((256, 0), (1024, 0), (2048, 0), (1024, 8), (0, 8))  # (prefill tokens, decodes) per forward


def timed(fn: Callable[[], object], repeats: int) -> tuple[float, float]:
    """Median (host ms, GPU ms) of `fn`, the GPU idle at each start."""
    fn()
    torch.cuda.synchronize()
    host, gpu = [], []
    for _ in range(repeats):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        t0 = time.perf_counter()
        fn()
        host.append((time.perf_counter() - t0) * 1e3)
        end.record()
        end.synchronize()
        gpu.append(begin.elapsed_time(end))
    return statistics.median(host), statistics.median(gpu)


def forwards(args: argparse.Namespace) -> None:
    """The table of host and GPU time per shape (and `--cprofile`'s functions) for one model and dtype."""
    import triton  # on the GPU machine only, as the kernels module

    from executor.model import fp8_kernels

    family = Family(args.model)
    config = full_size(family)
    device = torch.device("cuda")
    model = random_model(config, dtype=torch.bfloat16, device=device, seed=0)
    if args.quantization == "fp8":
        fp8.quantize_model(model, "fp8")
        torch.cuda.empty_cache()
    kv_dtype = fp8.FP8 if args.kv_cache_dtype == "fp8" else torch.bfloat16
    decodes_max = max(b for _, b in SHAPES)
    capacity = decodes_max * pages_for(PROMPT + MASKS) + 2 * pages_for(2048) + 8
    cache = PagedKVCache.for_model(PagePool(capacity), config, dtype=kv_dtype, device=device)
    backend = make_backend(device, config, dtype=torch.bfloat16, kv_dtype=kv_dtype)
    prefill = make_prefill_attention(device, config, torch.bfloat16, kv_dtype)
    runner = ModelRunner(model, cache, backend, prefill)

    def tokens(n: int, seed: int) -> torch.Tensor:
        return torch.randint(0, config.mask_id, (n,), generator=torch.Generator().manual_seed(seed))

    decodes = []
    for rid in range(decodes_max):
        ids = torch.cat([tokens(PROMPT, rid), torch.full((MASKS,), config.mask_id)])
        cache.pool.allocate(rid, pages_for(len(ids)))
        runner.forward([ForwardItem(rid, Phase.PREFILL, ids, PROMPT)])
        decodes.append(ForwardItem(rid, Phase.DECODE, ids, PROMPT))
    label = f"{family.value} {args.quantization} kv {args.kv_cache_dtype}"
    compiled = getattr(fp8_kernels, "COMPILED_LAUNCH", False) and fp8_kernels._COMPILED_TAKES_ALL
    versions = f"torch {torch.__version__}, triton {triton.__version__}"
    launch = "compiled handles" if compiled else "Triton's own"
    print(f"# {label} on {torch.cuda.get_device_name()}: {versions}, launches through {launch}")
    print(f"{'shape':<22} {'host ms':>8} {'gpu ms':>8} {'host/gpu':>8}")
    for size, batch in SHAPES:
        items = decodes[:batch]
        if size:
            rid = 10_000 + size
            cache.pool.allocate(rid, pages_for(size))
            items = [*items, ForwardItem(rid, Phase.PREFILL, tokens(size, size), max(32, size - MASKS))]
        host, gpu = timed(lambda: runner.forward(items), args.repeats)  # noqa: B023  # called at once
        if size:
            cache.pool.release(10_000 + size)
        shape = " + ".join(([f"prefill {size}"] if size else []) + ([f"{batch} decodes"] if batch else []))
        print(f"{shape:<22} {host:8.2f} {gpu:8.2f} {host / gpu:8.2f}", flush=True)
    if args.cprofile:
        profiler = cProfile.Profile()
        profiler.runcall(lambda: [runner.forward(decodes[:8]) for _ in range(10)])
        pstats.Stats(profiler).sort_stats("tottime").print_stats(args.cprofile)


def ops() -> None:
    """Host time of one launch of each operation of an eager FP8 layer, at 256 rows of LLaDA-8B's widths."""
    import flashinfer

    from executor.model import fp8_kernels

    device, rows, hidden, heads, dim = torch.device("cuda"), 256, 4096, 32, 128
    x = torch.randn(rows, hidden, device=device, dtype=torch.bfloat16)
    residual, weight = x.clone(), torch.ones(hidden, device=device, dtype=torch.bfloat16)
    layer = fp8.Fp8Linear.from_linear(
        torch.nn.Linear(hidden, 3 * hidden, bias=False, device=device).bfloat16()
    )
    values, scale = fp8.quantize_rows(x)
    k = torch.randn(rows, heads, dim, device=device, dtype=torch.bfloat16)
    pages = torch.zeros(rows, 2, 16, heads, dim, device=device, dtype=fp8.FP8)
    slots = torch.arange(rows, device=device) * 32

    def own_launch() -> object:
        fp8_kernels.COMPILED_LAUNCH = False
        try:
            return fp8_kernels.quantize_rows(x)
        finally:
            fp8_kernels.COMPILED_LAUNCH = True

    cases: dict[str, Callable[[], object]] = {
        "torch add (baseline)": lambda: x.add(1.0),
        "torch.empty": lambda: torch.empty(rows, hidden, device=device),
        "cast to fp16": lambda: x.to(torch.float16),
        "triton quantize_rows": lambda: fp8_kernels.quantize_rows(x),
        "torch._scaled_mm": lambda: layer.gemm(values, scale, torch.bfloat16),
        "flashinfer rmsnorm": lambda: flashinfer.rmsnorm(x, weight, 1e-5),
        "flashinfer fused_add_rmsnorm": lambda: flashinfer.fused_add_rmsnorm(x, residual, weight, 1e-5),
    }
    if hasattr(fp8_kernels, "COMPILED_LAUNCH"):  # the fused kernels and their launcher (absent before them)
        cases["triton quantize_rows, Triton's launch"] = own_launch
        cases["triton add_rmsnorm_quantize_rows"] = lambda: fp8_kernels.add_rmsnorm_quantize_rows(
            x, residual, weight, 1e-5
        )
        cases["triton store_kv"] = lambda: fp8_kernels.store_kv(pages, slots, k, k, 16)
    print(f"{'operation (256 rows)':<34} {'host us':>8}")
    for name, fn in cases.items():
        fn()
        torch.cuda.synchronize()
        per_call = []
        for _ in range(5):
            torch.cuda._sleep(50_000_000)  # keeps the GPU busy: no launch waits on a full queue
            t0 = time.perf_counter()
            for _ in range(200):
                fn()
            per_call.append((time.perf_counter() - t0) / 200 * 1e6)
            torch.cuda.synchronize()
        print(f"{name:<34} {statistics.median(per_call):8.1f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=[f.value for f in Family], default=Family.LLADA.value)
    parser.add_argument("--quantization", choices=["bf16", "fp8"], default="fp8")
    parser.add_argument("--kv-cache-dtype", choices=["auto", "fp8"], default="fp8")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--ops", action="store_true", help="also the host time of each FP8 layer operation")
    parser.add_argument("--cprofile", type=int, default=0, metavar="N", help="the N costliest host functions")
    parser.add_argument("--triton-launch", action="store_true", help="Triton's own launch path throughout")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("launch_cost: needs a CUDA GPU")
    if args.triton_launch:
        from executor.model import fp8_kernels

        fp8_kernels.COMPILED_LAUNCH = False
    forwards(args)
    if args.ops:
        ops()


if __name__ == "__main__":
    main()
