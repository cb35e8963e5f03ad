"""Executor speed on one GPU: full-size LLaDA-8B and Dream-7B with random bf16 weights, FlashInfer attention.

Run on the accelerator machine, from the repository root (FlashInfer installed):

    python -m benchmarks.executor_speed [--models llada dream] [--profile B...] [--json FILE]

Prefill iterations: one request of S tokens (S in 1024, 2048, 4096). Decode-only iterations: B requests
(B in 1..32), each forwarding its 32-token block (33 rows for Dream) over 1819 cached positions (795 prompt
+ 1024 mask), eagerly and replayed from CUDA graphs. Each row is the median, over repeats, of the CUDA-event
time of one whole `forward` call (host packing and FlashInfer `plan` included, synchronised every iteration
as the worker is), next to its roofline bound max(FLOPs / 790 TFLOP/s, bytes / 4.3 TB/s) where

    FLOPs = 2 * body parameters * query rows                       (linear layers)
          + 4 * query rows * KV length * heads * head_dim * layers (non-causal attention, per item)
          + 2 * hidden * vocab * 32 per item                       (LM head on the block)
    bytes = body and LM-head weights once (bf16) + per decode item its KV read (KV length * KV bytes per
            token), per prefill its KV written.

Targets (issue 3): prefill at S >= 2048 reaches >= 65% of its bound; decode at B >= 4 runs within 1.5x of it.
`x serial` is the time as a multiple of the linear layers' bound plus attention's own bound, one after the
other, which is what kernels that do not overlap can reach; `--table FILE` prints the rows of an earlier
`--json FILE` (no GPU needed). `--profile B...` adds, per model, a kernel-time breakdown (torch.profiler)
of a prefill and of eager and graphed decodes of B items. Each model is measured in a fresh process of its
own (`bench_alone`). Only stdout is written, plus the rows as JSON with `--json FILE`.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields

import torch

from executor.model import layers
from executor.model.attention import TorchAttention
from executor.model.config import Family, ModelConfig, full_size
from executor.model.cuda_graphs import DUMMY_PAGES, GraphedModelRunner
from executor.model.flashinfer_backend import FlashInferAttention, make_backend, warm_up_kernels
from executor.model.forward import ModelRunner
from executor.model.kv_cache import PagedKVCache
from executor.model.loading import random_model
from executor.model.microbatch import ForwardItem, Phase
from sangam.hardware import BLOCK, GPUS, MODELS, ModelSpec, pages_for
from sangam.kv import PagePool

GPU = GPUS["h200"]
PROMPT, MASKS = 795, 1024  # ShareGPT median prompt plus the mask buffer: 1819 cached positions
SPECS = {Family.LLADA: MODELS["llada-8b"], Family.DREAM: MODELS["dream-7b"]}


@dataclass(frozen=True, slots=True)
class Row:
    model: str
    phase: str  # prefill | decode
    size: int  # S for a prefill, B for a decode
    context: int  # KV length each item attends to
    graphs: str  # "-" (prefill), "off", "on"
    fused: bool  # FlashInfer RMSNorm / SiLU-and-mul / RoPE
    ms: float
    flops: float
    bytes: float
    bound_ms: float
    bound_by: str
    target: str  # "" where the issue sets none
    error: float | None = None  # graphed vs eager logits, mean relative error


def count_parts(
    spec: ModelSpec, items: int, query_rows: int, kv_len: int, decode: bool
) -> tuple[tuple[float, float], tuple[float, float]]:
    """(FLOPs, bytes) of one iteration of `items` identical items: its linear layers and LM head, then its
    attention (KV read by a decode, written by a prefill)."""
    linear = (
        2 * spec.layers * spec.layer_params * items * query_rows
        + 2 * spec.hidden * spec.vocab * BLOCK * items
    )
    weights = 2 * (spec.layers * spec.layer_params + spec.vocab * spec.hidden)
    attention = 4 * query_rows * kv_len * spec.heads * spec.head_dim * spec.layers * items
    kv = items * (kv_len if decode else query_rows) * spec.kv_bytes_per_token
    return (float(linear), float(weights)), (float(attention), float(kv))


def count(spec: ModelSpec, items: int, query_rows: int, kv_len: int, decode: bool) -> tuple[float, float]:
    """(FLOPs, bytes) of one iteration of `items` identical items."""
    (linear, weights), (attention, kv) = count_parts(spec, items, query_rows, kv_len, decode)
    return linear + attention, weights + kv


def iteration_shape(family: Family, phase: str, size: int) -> tuple[int, int]:
    """(items, query rows per item): one prefill of S rows, or B decode blocks (33 rows each for Dream)."""
    if phase == "prefill":
        return 1, size
    return size, BLOCK + full_size(family).logit_shift


def serial_bound_ms(row: Row) -> float:
    """The row's linear layers at their bound, then its attention at its own: what kernels that run one
    after another can reach (the roofline bound takes the max of the sums instead)."""
    family = Family(row.model)
    items, query_rows = iteration_shape(family, row.phase, row.size)
    parts = count_parts(SPECS[family], items, query_rows, row.context, row.phase == "decode")
    return sum(bound(flops, nbytes)[0] for flops, nbytes in parts)


def bound(flops: float, nbytes: float) -> tuple[float, str]:
    compute, memory = flops / (GPU.tflops * 1e12) * 1e3, nbytes / (GPU.tb_per_s * 1e12) * 1e3
    return (compute, "compute") if compute >= memory else (memory, "memory")


def time_ms(fn: Callable[[], object], warmup: int, repeats: int) -> float:
    """Median CUDA-event time of `fn`, the GPU idle at each start (as after a worker's sampling step)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float((actual.float() - expected.float()).abs().mean() / expected.float().abs().mean())


def random_tokens(config: ModelConfig, n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, config.mask_id, (n,), generator=torch.Generator().manual_seed(seed))


CATEGORIES = (
    ("attention", ("prefill", "merge_state", "mergestate", "attention")),
    ("gemm", ("gemm", "cutlass", "xmma", "nvjet", "cublas", "matmul", "splitk")),
    ("norm", ("norm",)),
    ("rope", ("rope", "rotary")),
    ("silu_mul", ("act_and_mul", "silu")),
    ("index/kv write", ("index", "scatter", "gather")),
    ("copy", ("memcpy", "memset", "copy")),
)


def category(kernel: str) -> str:
    name = kernel.lower()
    return next(
        (label for label, keys in CATEGORIES if any(key in name for key in keys)), "elementwise/other"
    )


def profile(label: str, fn: Callable[[], object], iterations: int = 3) -> None:
    """Kernel time per iteration by category, the top kernels, and the share of the wall time kept busy."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    fn()
    torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        for _ in range(iterations):
            fn()
            torch.cuda.synchronize()
        wall = (time.perf_counter() - start) / iterations * 1e3
    kernels: dict[str, tuple[float, int]] = {}
    for event in prof.key_averages():
        if getattr(event.device_type, "name", "") != "CUDA":
            continue
        us = float(
            getattr(event, "self_device_time_total", 0.0) or getattr(event, "self_cuda_time_total", 0.0)
        )
        kernels[event.key] = (us / 1e3 / iterations, event.count // iterations)
    busy = sum(ms for ms, _ in kernels.values())
    groups: dict[str, float] = defaultdict(float)
    for name, (ms, _) in kernels.items():
        groups[category(name)] += ms
    split = ", ".join(f"{k} {v:.2f}" for k, v in sorted(groups.items(), key=lambda kv: -kv[1]))
    print(
        f"[profile] {label}: wall {wall:.2f} ms/iter, kernels {busy:.2f} ms ({busy / wall:.0%} busy): {split}"
    )
    for name, (ms, calls) in sorted(kernels.items(), key=lambda kv: -kv[1][0])[:24]:
        print(f"[profile]     {ms:7.3f} ms  x{calls:<4d} {name[:110]}")


def bench_model(family: Family, args: argparse.Namespace) -> list[Row]:
    config, spec = full_size(family), SPECS[family]
    device, dtype = torch.device("cuda"), torch.bfloat16
    model = random_model(config, dtype=dtype, device=device, seed=0)
    context = PROMPT + MASKS
    max_batch = max(args.decode)
    capacity = max_batch * pages_for(context) + pages_for(max(args.prefill)) + DUMMY_PAGES + 8
    cache = PagedKVCache.for_model(PagePool(capacity), config, dtype=dtype, device=device)
    backend = make_backend(device, config, dtype=dtype)
    assert isinstance(backend, FlashInferAttention), "the benchmark measures FlashInfer attention"
    runner = ModelRunner(model, cache, backend)
    pool, rows = cache.pool, []

    def add(phase: str, size: int, ctx: int, graphs: str, ms: float, error: float | None = None) -> None:
        items, query_rows = iteration_shape(family, phase, size)
        flops, nbytes = count(spec, items, query_rows, ctx, phase == "decode")
        bound_ms, by = bound(flops, nbytes)
        if phase == "prefill":
            target = (">=65%" if size >= 2048 else "") if layers.FUSED_KERNELS else ""
        else:
            target = ("<=1.5x" if size >= 4 else "") if layers.FUSED_KERNELS else ""
        row = Row(
            family.value,
            phase,
            size,
            ctx,
            graphs,
            layers.FUSED_KERNELS,
            ms,
            flops,
            nbytes,
            bound_ms,
            by,
            target,
            error,
        )
        rows.append(row)
        print(format_row(row), flush=True)

    def eager(items: list[ForwardItem], warmup: int) -> float:
        return time_ms(lambda: runner.forward(items), warmup, args.repeats)

    def replayed(graphs: GraphedModelRunner, items: list[ForwardItem], warmup: int) -> float:
        return time_ms(lambda: graphs.forward(items), warmup, args.repeats)

    def prefill(size: int) -> float:
        rid = 1_000_000 + size
        tokens = random_tokens(config, size, seed=size)
        pool.allocate(rid, pages_for(size))
        item = ForwardItem(rid, Phase.PREFILL, tokens, max(BLOCK, size - MASKS))
        try:
            return time_ms(lambda: runner.forward([item]), args.warmup, args.repeats)
        finally:
            pool.release(rid)

    print(f"# {family.value}: prefill", flush=True)
    for size in args.prefill:
        add("prefill", size, size, "-", prefill(size))

    # decode: max_batch requests whose block follows a prefill over prompt + masks
    requests = []
    for rid in range(max_batch):
        tokens = torch.cat([random_tokens(config, PROMPT, seed=rid), torch.full((MASKS,), config.mask_id)])
        pool.allocate(rid, pages_for(context))
        requests.append(ForwardItem(rid, Phase.PREFILL, tokens, PROMPT))
    for start in range(0, max_batch, 8):
        runner.forward(requests[start : start + 8])
    decodes = [ForwardItem(r.request_id, Phase.DECODE, r.tokens, r.block_start) for r in requests]

    graphed = None
    if not args.no_graphs:
        graphed = GraphedModelRunner(runner, buckets=args.decode)
        print(f"# {family.value}: decode graphs {args.decode} captured in {graphed.capture_seconds:.1f} s")
    print(f"# {family.value}: decode", flush=True)
    for size in args.decode:
        items = decodes[:size]
        add("decode", size, context, "off", eager(items, args.warmup))
        if graphed is not None:
            ms = replayed(graphed, items, args.warmup)
            graphed.host_milliseconds()  # reset, then host time of replays that start on an idle GPU
            for _ in range(5):
                graphed.forward(items)
                torch.cuda.synchronize()
            host = ", ".join(f"{k} {v:.2f}" for k, v in graphed.host_milliseconds().items())
            error = relative_error(graphed.forward(items), runner.forward(items))
            add("decode", size, context, "on", ms, error)
            print(f"#   host ms per replay: {host}")
    # the bf16 noise floor of this random-weight model: the same decode with torch attention
    items = decodes[: min(4, max_batch)]
    noise = relative_error(runner.forward(items), ModelRunner(model, cache, TorchAttention()).forward(items))
    print(
        f"# {family.value}: decode B={len(items)} logits, FlashInfer vs torch attention (eager): {noise:.1e}"
    )

    if args.compare_unfused:  # the same model with the torch norm / activation / RoPE code
        layers.FUSED_KERNELS = False
        try:
            add("prefill", 2048, 2048, "-", prefill(2048))
            for size in (1, 8):
                add("decode", size, context, "off", eager(decodes[:size], 2))
            if graphed is not None:  # graphs captured with fused kernels: recapture without
                graphed.close()
                graphed = GraphedModelRunner(runner, buckets=(1, 8))
                for size in (1, 8):
                    add("decode", size, context, "on", replayed(graphed, decodes[:size], 2))
        finally:
            layers.FUSED_KERNELS = True
            if graphed is not None:
                graphed.close()
                graphed = GraphedModelRunner(runner, buckets=args.profile) if args.profile else None

    if args.profile:
        pool.allocate(-2, pages_for(2048))
        item = ForwardItem(-2, Phase.PREFILL, random_tokens(config, 2048, seed=2), 1024)
        profile(f"{family.value} prefill S=2048", lambda: runner.forward([item]))
        pool.release(-2)
        for size in args.profile:
            batch = decodes[:size]
            profile(f"{family.value} decode B={size} eager", lambda batch=batch: runner.forward(batch))
            if graphed is not None:
                profile(f"{family.value} decode B={size} graphs", lambda batch=batch: graphed.forward(batch))

    if graphed is not None:
        graphed.close()
    return rows  # the model, its cache and its graphs die with this frame


def bench_alone(family: Family, args: argparse.Namespace) -> list[Row]:
    """`bench_model` in a fresh process, as a worker serves one model: in one process, the second model's
    graphs took ten times as long to launch on an H200 (0.3 against 0.03 ms a replay)."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        rows: list[Row] = pool.apply(bench_model, (family, args))
    return rows


HEADER = (
    f"{'model':<6} {'phase':<7} {'S/B':>5} {'ctx':>5} {'graphs':>6} {'fused':>5} {'ms':>8} "
    f"{'bound ms':>8} {'bound':>7} {'TFLOP/s':>7} {'TB/s':>5} {'x bound':>7} {'%roof':>5} {'target':>6} "
    f"{'met':>4} {'x serial':>8} {'g-err':>7}"
)


def met(row: Row) -> str:
    if not row.target:
        return ""
    ok = row.bound_ms / row.ms >= 0.65 if row.phase == "prefill" else row.ms / row.bound_ms <= 1.5
    return "yes" if ok else "NO"


def format_row(row: Row) -> str:
    error = "" if row.error is None else f"{row.error:.1e}"
    return (
        f"{row.model:<6} {row.phase:<7} {row.size:>5} {row.context:>5} {row.graphs:>6} {row.fused!s:>5} "
        f"{row.ms:>8.2f} {row.bound_ms:>8.2f} {row.bound_by:>7} {row.flops / row.ms / 1e9:>7.0f} "
        f"{row.bytes / row.ms / 1e9:>5.2f} {row.ms / row.bound_ms:>7.2f} {row.bound_ms / row.ms:>5.0%} "
        f"{row.target:>6} {met(row):>4} {row.ms / serial_bound_ms(row):>8.2f} {error:>7}"
    )


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--models", nargs="+", choices=[f.value for f in Family], default=[f.value for f in Family]
    )
    parser.add_argument("--prefill", nargs="+", type=int, default=[1024, 2048, 4096])
    parser.add_argument("--decode", nargs="+", type=int, default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--no-graphs", action="store_true", help="skip the CUDA-graph decode rows")
    parser.add_argument("--compare-unfused", action="store_true", help="add rows with the torch layer code")
    parser.add_argument(
        "--profile", nargs="+", type=int, metavar="B", help="kernel-time breakdowns at these decode sizes"
    )
    parser.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    parser.add_argument("--table", metavar="FILE", help="print the rows of an earlier --json FILE (no GPU)")
    return parser.parse_args(argv)


def load_rows(path: str) -> list[Row]:
    """The rows of a `--json` file; a file that holds none exits with a one-line error."""
    try:
        with open(path) as handle:
            entries = json.load(handle)
        rows = [Row(**{field.name: entry[field.name] for field in fields(Row)}) for entry in entries]
        if not rows:
            raise ValueError("an empty list")
        for row in rows:
            Family(row.model)  # ValueError for a model the bounds know nothing of
            for name in ("ms", "bound_ms", "flops", "bytes"):
                if not (isinstance(getattr(row, name), int | float) and getattr(row, name) > 0):
                    raise ValueError(f"{name} must be a positive number, got {getattr(row, name)!r}")
        return rows
    except (OSError, ValueError, KeyError, TypeError) as error:
        sys.exit(f"executor_speed: {path} holds no benchmark rows ({type(error).__name__}: {error})")


def print_table(rows: Sequence[Row]) -> None:
    print(HEADER)
    for row in rows:
        print(format_row(row))


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(argv)
    if args.table:
        print_table(load_rows(args.table))
        return
    if not torch.cuda.is_available():
        sys.exit("executor_speed needs a CUDA GPU")
    args.decode = sorted(set(args.decode))
    built = warm_up_kernels("cuda")
    print(f"# FlashInfer kernels ready: {', '.join(f'{k} {v:.1f} s' for k, v in built.items())}")
    print(
        f"# {torch.cuda.get_device_name()}, torch {torch.__version__}; roofline {GPU.tflops} TFLOP/s, "
        f"{GPU.tb_per_s} TB/s; median of {args.repeats} after {args.warmup} warm-up"
    )
    rows = [row for name in args.models for row in bench_alone(Family(name), args)]
    print()
    print_table(rows)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump([asdict(row) | {"met": met(row)} for row in rows], handle, indent=1)


if __name__ == "__main__":
    main()
