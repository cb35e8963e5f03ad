"""Executor speed on one GPU: full-size LLaDA-8B and Dream-7B with random bf16 weights, FlashInfer attention.

Run on the accelerator machine, from the repository root (FlashInfer installed):

    python -m benchmarks.executor_speed [--models llada dream] [--quantization bf16 fp8] [--profile B...]
        [--gemms] [--json FILE]

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

With `--quantization fp8` the body's linear layers run in FP8 (`executor.model.fp8`), and, as a worker serves
them, prefills and other eager forwards replay the body from piecewise CUDA graphs
(`executor.model.piecewise_graphs`; `--eager-bodies` runs them eagerly). The linear weights count
one byte each and their FLOPs run at FP8_SPEEDUP times the bf16 rate in the bound (LM head and attention
stay bf16). With `--kv-cache-dtype fp8` the paged KV is E4M3 (FlashInfer's fa2 kernels read it), its
bytes count one per element in the bound, and the rows' weights column reads `<quant>+kv8`. Each (model,
quantization) pair is measured in a fresh process of its own, on the same seeded weights.

Targets (issue 3): prefill at S >= 2048 reaches >= 65% of its bound; decode at B >= 4 runs within 1.5x of it.
Issue 30's FP8 targets are times, for both models: decode of 8 items <= 5.5 ms, of 32 <= 19 ms, prefill
of 2,048 tokens <= 32 ms.
`x serial` is the time as a multiple of the linear layers' bound plus attention's own bound, one after the
other, which is what kernels that do not overlap can reach; `--table FILE` prints the rows of an earlier
`--json FILE` (no GPU needed). `--profile B...` adds, per model, a kernel-time breakdown (torch.profiler)
of a prefill and of eager and graphed decodes of B items, and where the GPU idles in the prefill and
when each of the runner's host steps ran in it.
`--gemms` times each linear layer's GEMM alone at the decode and prefill row counts: bf16 against FP8
(row-wise scales, with and without fast accumulation; per-tensor scales) and the activation quantization. Each
model is measured in a fresh process of its own (`bench_alone`). Only stdout is written, plus the rows as JSON
with `--json FILE`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import statistics
import sys
import time
import types
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import MISSING, asdict, dataclass, fields

import torch

from executor.model import cuda_graphs, fp8, layers, prefill_attention
from executor.model.attention import TorchAttention
from executor.model.config import Family, ModelConfig, full_size
from executor.model.cuda_graphs import DUMMY_PAGES, GraphedModelRunner
from executor.model.flashinfer_backend import FlashInferAttention, make_backend, warm_up_kernels
from executor.model.forward import ModelRunner
from executor.model.kv_cache import PagedKVCache
from executor.model.loading import random_model
from executor.model.microbatch import ForwardItem, Phase
from executor.model.piecewise_graphs import PiecewiseGraphs
from executor.model.prefill_attention import make_prefill_attention
from sangam.hardware import BLOCK, GPUS, KV_DTYPE_BYTES, ModelSpec, pages_for
from sangam.kv import PagePool

GPU = GPUS["h200"]
PROMPT, MASKS = 795, 1024  # ShareGPT median prompt plus the mask buffer: 1819 cached positions
FP8_SPEEDUP = 2.0  # Hopper's dense FP8 tensor-core rate over bf16's (H100/H200 datasheet: 1979 / 989)
FP8_TARGETS = {("decode", 8): 5.5, ("decode", 32): 19.0, ("prefill", 2048): 32.0}  # ms, issue 30


@dataclass(frozen=True, slots=True)
class Row:
    model: str
    phase: str  # prefill | decode
    size: int  # S for a prefill, B for a decode
    context: int  # KV length each item attends to
    graphs: str  # "-" (prefill), "off" (no decode graph; FP8: the body from piecewise graphs), "on"
    fused: bool  # FlashInfer RMSNorm / SiLU-and-mul / RoPE
    ms: float
    flops: float
    bytes: float
    bound_ms: float
    bound_by: str
    target: str  # "" where the issue sets none; "<=1.5x", ">=65%" (of the bound) or "<=5.5ms"
    error: float | None = None  # graphed vs eager logits, mean relative error
    quant: str = "bf16"  # bf16 | fp8: the body's linear layers
    kv: str = "auto"  # auto (bf16) | fp8: the paged KV cache


Part = tuple[float, float, float]  # FLOPs, bytes, the peak rate (TFLOP/s) the FLOPs run at


def count_parts(
    spec: ModelSpec,
    items: int,
    query_rows: int,
    kv_len: int,
    decode: bool,
    quant: str = "bf16",
    kv_dtype: str = "auto",
) -> tuple[tuple[Part, Part], Part]:
    """((the body's linear layers, the LM head), attention) of one iteration of `items` identical items,
    each (FLOPs, bytes, peak TFLOP/s); attention reads the KV (of `kv_dtype`) in a decode, writes it in a
    prefill."""
    body = 2.0 * spec.layers * spec.layer_params * items * query_rows
    head = 2.0 * spec.hidden * spec.vocab * BLOCK * items
    weight_bytes = 1 if quant == "fp8" else 2
    rate = GPU.tflops * (FP8_SPEEDUP if quant == "fp8" else 1.0)
    attention = 4.0 * query_rows * kv_len * spec.heads * spec.head_dim * spec.layers * items
    kv = float(items * (kv_len if decode else query_rows) * spec.kv_bytes_per_token(kv_dtype))
    linear = (
        (body, float(weight_bytes * spec.layers * spec.layer_params), rate),
        (head, float(2 * spec.vocab * spec.hidden), GPU.tflops),
    )
    return linear, (attention, kv, GPU.tflops)


def count(spec: ModelSpec, items: int, query_rows: int, kv_len: int, decode: bool) -> tuple[float, float]:
    """(FLOPs, bytes) of one bf16 iteration of `items` identical items."""
    linear, attention = count_parts(spec, items, query_rows, kv_len, decode)
    parts = (*linear, attention)
    return sum(p[0] for p in parts), sum(p[1] for p in parts)


def parts_bound(parts: Sequence[Part]) -> tuple[float, str]:
    """The roofline bound of `parts` run together: max(their FLOPs at their rates, their bytes)."""
    compute = sum(flops / (rate * 1e12) for flops, _, rate in parts) * 1e3
    memory = sum(nbytes for _, nbytes, _ in parts) / (GPU.tb_per_s * 1e12) * 1e3
    return (compute, "compute") if compute >= memory else (memory, "memory")


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
    linear, attention = count_parts(
        full_size(family).shape, items, query_rows, row.context, row.phase == "decode", row.quant, row.kv
    )
    return parts_bound(linear)[0] + parts_bound([attention])[0]


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
    ("fp8 quantize", ("quantize",)),
    # `_attend` and `_merge`: Fp8PageAttention's Triton kernels
    ("attention", ("prefill", "merge_state", "mergestate", "attention", "_attend", "_merge")),
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


def idle(label: str, fn: Callable[[], object], runner: ModelRunner, top: int = 8) -> None:
    """Where the GPU idles in one call of `fn` (after a warm-up): the time from the call's start to its first
    GPU work, the idle between its GPU events (kernels, copies, memsets), and the longest such gaps with the
    events on either side; and when each of `runner`'s host steps ran (`host_steps`) and when the call
    returned to the host, against the call's start."""
    from torch.profiler import ProfilerActivity, record_function
    from torch.profiler import profile as torch_profile

    fn()
    torch.cuda.synchronize()
    with (
        torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof,
        scoped(host_steps(runner)),
    ):
        with record_function("call"):
            fn()
        torch.cuda.synchronize()
    events = prof.events()
    call = next(e for e in events if e.name == "call")
    gpu = sorted(
        (e.time_range.start, e.time_range.end, e.name)
        for e in events
        if getattr(e.device_type, "name", "") == "CUDA" and e.time_range.end > e.time_range.start
    )
    if not gpu:
        print(f"[idle] {label}: no GPU events")
        return
    gaps, reach = [], gpu[0][1]
    for (_, end, before), (start, _, after) in itertools.pairwise(gpu):
        reach = max(reach, end)
        if start > reach:
            gaps.append((start - reach, before, after))
    total = sum(gap for gap, _, _ in gaps) / 1e3
    span = (max(end for _, end, _ in gpu) - gpu[0][0]) / 1e3
    origin = call.time_range.start
    print(
        f"[idle] {label}: first GPU work {(gpu[0][0] - origin) / 1e3:.2f} ms after the call starts; GPU span "
        f"{span:.2f} ms, idle {total:.2f} ms in {len(gaps)} gaps; the host returns at "
        f"{(call.time_range.end - origin) / 1e3:.2f} ms"
    )
    for gap, before, after in sorted(gaps, reverse=True)[:top]:
        print(f"[idle]     {gap:8.1f} us  after {before[:50]}  before {after[:50]}")
    steps: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for e in events:
        if e.name.startswith("host:"):
            steps[e.name[5:]].append((e.time_range.start - origin, e.time_range.end - e.time_range.start))
    for name, spans in sorted(steps.items(), key=lambda kv: kv[1][0][0]):
        print(
            f"[idle]     host {name:<22} x{len(spans):<3} first at {spans[0][0] / 1e3:6.2f} ms, "
            f"{spans[0][1] / 1e3:6.3f} ms then, {sum(d for _, d in spans) / 1e3:6.3f} ms in all"
        )


def host_steps(runner: ModelRunner) -> list[tuple[object, str]]:
    """The runner's host steps of one forward, as (owner, attribute) pairs for `scoped`."""
    from executor.model import forward

    pairs = [
        (runner.cache, "page_table"), (forward, "plan_microbatch"), (runner.backend, "plan"),
        (runner.prefill, "plan"), (forward.PagedAttention, "__call__"), (runner.pieces, "run"),
        (runner.model, "body"), (runner.model, "head"),
    ]  # fmt: skip
    return [(owner, name) for owner, name in pairs if owner is not None]


@contextmanager
def scoped(steps: Sequence[tuple[object, str]]) -> Iterator[None]:
    """Within the block, each (owner, attribute) callable runs inside a profiler scope `host:<name>`
    (`host:<class>.<name>` for a class's or an instance's method)."""
    from torch.profiler import record_function

    def wrap(name: str, call: Callable[..., object]) -> Callable[..., object]:
        def run(*args: object, **kwargs: object) -> object:
            with record_function(f"host:{name}"):
                return call(*args, **kwargs)

        return run

    absent = object()  # the owner had no attribute of its own (an instance's method, say)
    saved: list[tuple[object, str, object]] = []
    try:
        for owner, name in steps:
            kind = owner if isinstance(owner, type) else type(owner)
            label = name if isinstance(owner, types.ModuleType) else f"{kind.__name__}.{name}"
            wrapped = wrap(label, getattr(owner, name))
            saved.append((owner, name, vars(owner).get(name, absent)))
            setattr(owner, name, wrapped)
        yield
    finally:
        for owner, name, own in reversed(saved):
            if own is absent:
                delattr(owner, name)
            else:
                setattr(owner, name, own)


def bench_model(family: Family, args: argparse.Namespace, quant: str = "bf16") -> list[Row]:
    config = full_size(family)
    spec = config.shape
    device, dtype = torch.device("cuda"), torch.bfloat16
    model = random_model(config, dtype=dtype, device=device, seed=0)
    if quant != "bf16":
        fp8.quantize_model(model, quant)
        torch.cuda.empty_cache()
    fp8.FAST_ACCUM = not args.exact_accum  # this process's (bench_alone spawns one per model)
    cuda_graphs.FP8_PAGE_KERNEL = not args.fa2_pages
    prefill_attention.TRITON_KERNEL = not args.fa2_prefill
    weights = fp8.weight_bytes(model) / 2**30
    accumulation = f" (fast accumulation {fp8.FAST_ACCUM})" if quant != "bf16" else ""
    print(f"# {family.value} {quant}{accumulation}: weights {weights:.2f} GiB")
    context = PROMPT + MASKS
    max_batch = max(args.decode)
    capacity = max_batch * pages_for(context) + pages_for(max(args.prefill)) + DUMMY_PAGES + 8
    kv_dtype = fp8.FP8 if args.kv_cache_dtype == "fp8" else dtype
    cache = PagedKVCache.for_model(PagePool(capacity), config, dtype=kv_dtype, device=device)
    backend = make_backend(device, config, dtype=dtype, kv_dtype=kv_dtype)
    assert isinstance(backend, FlashInferAttention), "the benchmark measures FlashInfer attention"
    prefill = None if args.paged_prefill else make_prefill_attention(device, config, dtype, kv_dtype)
    # as a worker serves FP8 weights: the eager forwards' bodies from piecewise graphs
    pieces = PiecewiseGraphs(model) if quant != "bf16" and not args.eager_bodies else None
    if pieces is not None:
        print(f"# {family.value}: piecewise graphs captured in {pieces.capture_seconds:.1f} s", flush=True)
    runner = ModelRunner(model, cache, backend, prefill, pieces)
    pool, rows = cache.pool, []

    def add(phase: str, size: int, ctx: int, graphs: str, ms: float, error: float | None = None) -> None:
        items, query_rows = iteration_shape(family, phase, size)
        linear, attention = count_parts(
            spec, items, query_rows, ctx, phase == "decode", quant, args.kv_cache_dtype
        )
        flops, nbytes = count(spec, items, query_rows, ctx, phase == "decode")
        bound_ms, by = parts_bound((*linear, attention))
        if quant != "bf16":
            target = f"<={FP8_TARGETS[phase, size]:g}ms" if (phase, size) in FP8_TARGETS else ""
        elif phase == "prefill":
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
            quant,
            args.kv_cache_dtype,
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

    if args.gemms and quant != "bf16":
        gemms(family)
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
    print(f"# {family.value}: decode B={len(items)} logits, FlashInfer vs torch attention: {noise:.1e}")

    if args.compare_unfused:  # the same model with the torch norm / activation / RoPE code
        layers.FUSED_KERNELS = False
        runner.pieces, pieces = None, runner.pieces  # captured with the fused kernels: eager bodies here
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
            runner.pieces = pieces
            if graphed is not None:
                graphed.close()
                graphed = GraphedModelRunner(runner, buckets=args.profile) if args.profile else None

    if args.profile:
        pool.allocate(-2, pages_for(2048))
        item = ForwardItem(-2, Phase.PREFILL, random_tokens(config, 2048, seed=2), 1024)
        profile(f"{family.value} prefill S=2048", lambda: runner.forward([item]))
        idle(f"{family.value} prefill S=2048", lambda: runner.forward([item]), runner)
        pool.release(-2)
        for size in args.profile:
            batch = decodes[:size]
            profile(f"{family.value} decode B={size} eager", lambda batch=batch: runner.forward(batch))
            if graphed is not None:
                profile(f"{family.value} decode B={size} graphs", lambda batch=batch: graphed.forward(batch))

    if graphed is not None:
        graphed.close()
    return rows  # the model, its cache and its graphs die with this frame


def bench_alone(family: Family, args: argparse.Namespace, quant: str = "bf16") -> list[Row]:
    """`bench_model` in a fresh process, as a worker serves one model: in one process, the second model's
    graphs took ten times as long to launch on an H200 (0.3 against 0.03 ms a replay)."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        rows: list[Row] = pool.apply(bench_model, (family, args, quant))
    return rows


def gemm_shapes(family: Family) -> dict[str, tuple[int, int]]:
    """(K, N) of each linear layer of the body."""
    shape = full_size(family).shape
    return {
        "qkv": (shape.hidden, shape.qkv_width),
        "o": (shape.heads * shape.head_dim, shape.hidden),
        "gate_up": (shape.hidden, 2 * shape.intermediate),
        "down": (shape.intermediate, shape.hidden),
    }


def time_gemm(
    x: torch.Tensor, weights: list[torch.Tensor], quantized: list[tuple[torch.Tensor, torch.Tensor]]
) -> list[float]:
    """ms of x @ w.T in bf16, FP8 row-wise (plain, fast accumulation), FP8 per-tensor, and x's quantization,
    each call on the next of the weights' copies."""
    xq, sx = fp8.quantize_rows(x)
    one = torch.ones((), device=x.device)
    turn = [0]

    def next_index() -> int:
        turn[0] += 1
        return turn[0] % len(weights)

    def bf16() -> torch.Tensor:
        return x @ weights[next_index()].t()

    def scaled(fast: bool, tensorwise: bool) -> torch.Tensor:
        wq, sw = quantized[next_index()]
        scale_a, scale_b = (one, one) if tensorwise else (sx, sw[None])
        return torch._scaled_mm(xq, wq.t(), scale_a, scale_b, out_dtype=torch.bfloat16, use_fast_accum=fast)

    return [
        graphed_ms(bf16),
        graphed_ms(lambda: scaled(False, False)),
        graphed_ms(lambda: scaled(True, False)),
        graphed_ms(lambda: scaled(False, True)),
        graphed_ms(lambda: fp8.quantize_rows(x)),
    ]


def graphed_ms(fn: Callable[[], object], calls: int = 24, replays: int = 10) -> float:
    """Median ms of one `fn` call, timed as `calls` calls captured in one CUDA graph (no launch gaps)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return time_ms(graph.replay, 2, replays) / calls


def gemms(family: Family) -> None:
    """Each linear layer's GEMM alone, at decodes of 8 and 32 items and a 2,048-token prefill: bf16
    against FP8 (row-wise scales without and with fast accumulation, the second as `Fp8Linear` runs it;
    per-tensor scales)
    and the per-token quantization kernel. Weights rotate over 4 copies, so most miss the L2."""
    device = torch.device("cuda")
    rows_per_item = BLOCK + full_size(family).logit_shift
    print(f"# {family.value} GEMMs alone, us (graphed, median; weights rotate over 4 copies)", flush=True)
    print(f"#   {'layer':<8} {'rows':>5} {'bf16':>7} {'fp8':>7} {'fast':>7} {'1x1':>7} {'quant':>7}")
    for name, (k, n) in gemm_shapes(family).items():
        weights = [torch.randn(n, k, device=device, dtype=torch.bfloat16) * 0.02 for _ in range(4)]
        quantized = [fp8.quantize_weight(w) for w in weights]
        for m in (8 * rows_per_item, 32 * rows_per_item, 2048):
            times = time_gemm(torch.randn(m, k, device=device, dtype=torch.bfloat16), weights, quantized)
            us = " ".join(f"{t * 1e3:>7.1f}" for t in times)
            print(f"#   {name:<8} {m:>5} {us}", flush=True)


HEADER = (
    f"{'model':<6} {'quant':<5} {'phase':<7} {'S/B':>5} {'ctx':>5} {'graphs':>6} {'fused':>5} {'ms':>8} "
    f"{'bound ms':>8} {'bound':>7} {'TFLOP/s':>7} {'TB/s':>5} {'x bound':>7} {'%roof':>5} {'target':>7} "
    f"{'met':>4} {'x serial':>8} {'g-err':>7}"
)


def met(row: Row) -> str:
    if not row.target:
        return ""
    if row.target.endswith("ms"):
        ok = row.ms <= float(row.target.removeprefix("<=").removesuffix("ms"))
    else:
        ok = row.bound_ms / row.ms >= 0.65 if row.phase == "prefill" else row.ms / row.bound_ms <= 1.5
    return "yes" if ok else "NO"


def quant_label(row: Row) -> str:
    """The row's weights, and `+kv8` where its KV cache is FP8."""
    return row.quant if row.kv == "auto" else f"{row.quant}+kv8"


def format_row(row: Row) -> str:
    error = "" if row.error is None else f"{row.error:.1e}"
    return (
        f"{row.model:<6} {quant_label(row):<5} {row.phase:<7} {row.size:>5} {row.context:>5} {row.graphs:>6} "
        f"{row.fused!s:>5} "
        f"{row.ms:>8.2f} {row.bound_ms:>8.2f} {row.bound_by:>7} {row.flops / row.ms / 1e9:>7.0f} "
        f"{row.bytes / row.ms / 1e9:>5.2f} {row.ms / row.bound_ms:>7.2f} {row.bound_ms / row.ms:>5.0%} "
        f"{row.target:>7} {met(row):>4} {row.ms / serial_bound_ms(row):>8.2f} {error:>7}"
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
    parser.add_argument(
        "--quantization", nargs="+", choices=("bf16", *fp8.QUANTIZATIONS), default=["bf16"],
        help="measure each model with these weights, side by side",
    )  # fmt: skip
    parser.add_argument(
        "--kv-cache-dtype", choices=tuple(KV_DTYPE_BYTES), default="auto", help="the paged KV cache's dtype"
    )
    parser.add_argument("--gemms", action="store_true", help="time each FP8 linear layer's GEMM alone")
    parser.add_argument(
        "--exact-accum", action="store_true", help="FP8 GEMMs without fast accumulation (the default has it)"
    )
    parser.add_argument(
        "--fa2-pages", action="store_true", help="decode graphs read FP8 pages through FlashInfer's fa2"
    )
    parser.add_argument(
        "--fa2-prefill",
        action="store_true",
        help="prefills over their own K/V rows through FlashInfer's fa2, not the Triton kernel",
    )
    parser.add_argument(
        "--paged-prefill",
        action="store_true",
        help="prefills over FP8 pages read them back, not their own K/V rows",
    )
    parser.add_argument(
        "--eager-bodies",
        action="store_true",
        help="FP8 forwards other than the decode graphs run eagerly, not from piecewise graphs",
    )
    parser.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    parser.add_argument("--table", metavar="FILE", help="print the rows of an earlier --json FILE (no GPU)")
    return parser.parse_args(argv)


def load_rows(path: str) -> list[Row]:
    """The rows of a `--json` file; a file that holds none exits with a one-line error."""
    try:
        with open(path) as handle:
            entries = json.load(handle)
        rows = [
            Row(**{f.name: entry[f.name] for f in fields(Row) if f.name in entry or f.default is MISSING})
            for entry in entries
        ]
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
    built = warm_up_kernels("cuda", kv_dtype=fp8.FP8 if args.kv_cache_dtype == "fp8" else None)
    print(f"# FlashInfer kernels ready: {', '.join(f'{k} {v:.1f} s' for k, v in built.items())}")
    print(
        f"# {torch.cuda.get_device_name()}, torch {torch.__version__}; roofline {GPU.tflops} TFLOP/s, "
        f"{GPU.tb_per_s} TB/s; median of {args.repeats} after {args.warmup} warm-up"
    )
    rows = [
        row
        for name in args.models
        for quant in args.quantization
        for row in bench_alone(Family(name), args, quant)
    ]
    print()
    print_table(rows)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump([asdict(row) | {"met": met(row)} for row in rows], handle, indent=1)


if __name__ == "__main__":
    main()
