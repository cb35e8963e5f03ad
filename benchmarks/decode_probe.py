"""Where decode iterations lose time on the GPU: the probes behind issue 3's decode target.

Run on the accelerator machine (FlashInfer installed): `python -m benchmarks.decode_probe [--tunable]`.

1. Attention of B decode items over 1819 cached positions, one layer, for LLaDA-8B (32 query and KV heads, 32
   rows per item) and Dream-7B (28 query heads over 4 KV heads, 33 rows), planned three ways:
   - `eager`: FlashInfer outside graphs (query tile from the mean item, KV split to fill the GPU);
   - `graph`: FlashInfer's CUDA-graph mode (always split; an MHA model also carries the empty tile entries of
     `executor.model.cuda_graphs`, without which the tile would be sized for one item holding every row);
   - `exact`: `FlashInferAttention(exact_grid=True)`, one work tile per item and query tile, KV unsplit;
   - `exact/2`, `exact/4`: the same with each item's rows cut into 2 or 4 sub-items over its whole KV
     (`executor.model.cuda_graphs.unsplit_subitems`), where each holds at least 16 packed rows.
   Each is captured in a CUDA graph of 20 runs and timed by replay (so host launches do not count), checked
   against `eager`, and put against the bound of reading the layer's KV once. The host time of one plan
   comes next to it: FlashInfer's own `plan` on the first call, then `FlashInferAttention`'s replans.
2. The projections of both models at their decode row counts (B items of 32 or 33 rows), each against the
   bound of reading its weight once; `--tunable` adds the same products after PyTorch's TunableOp tuned them.
"""

from __future__ import annotations

import argparse
import functools
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from executor.model.attention import AttentionLayout
from executor.model.cuda_graphs import TILE_ROWS, subitem_rows
from executor.model.flashinfer_backend import FlashInferAttention
from sangam.hardware import PAGE, pages_for

HEAD_DIM, CONTEXT, REPLAYS = 128, 1819, 20
TB_PER_S = 4.3
MODELS = {  # heads, kv_heads, rows per decode item, projections (in, out)
    "llada": (
        32,
        32,
        32,
        {"qkv": (4096, 12288), "o": (4096, 4096), "gate_up": (4096, 24576), "down": (12288, 4096)},
    ),
    "dream": (
        28,
        4,
        33,
        {"qkv": (3584, 4608), "o": (3584, 3584), "gate_up": (3584, 37888), "down": (18944, 3584)},
    ),
}
BATCHES = (1, 2, 4, 8, 16, 32)


def graph_ms(fn: Callable[[], object]) -> float:
    """GPU time of one `fn`, replayed from a CUDA graph holding REPLAYS of it."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(REPLAYS):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / (5 * REPLAYS)


def padded(layout: AttentionLayout, entries: int) -> AttentionLayout:
    """`layout` with `entries` extra items of no query rows, each over one token of page 0."""
    extra = torch.arange(1, entries + 1, dtype=torch.int32)
    return AttentionLayout(
        qo_indptr=torch.cat([layout.qo_indptr, layout.qo_indptr[-1] + 0 * extra]),
        kv_indptr=torch.cat([layout.kv_indptr, layout.kv_indptr[-1] + extra]),
        kv_indices=torch.cat([layout.kv_indices, torch.zeros(entries, dtype=torch.int32)]),
        kv_last_page_len=torch.cat([layout.kv_last_page_len, torch.ones(entries, dtype=torch.int32)]),
    )


def plan_ms(backend: FlashInferAttention, layouts: list[AttentionLayout]) -> tuple[float, float]:
    """Host ms of the first plan (FlashInfer's own) and the mean of 20 replans over alternating layouts."""
    start = time.perf_counter()
    backend.plan(layouts[0])
    first = (time.perf_counter() - start) * 1e3
    start = time.perf_counter()
    for i in range(20):
        backend.plan(layouts[(i + 1) % len(layouts)])
    return first, (time.perf_counter() - start) * 1e3 / 20


def attention(model: str, batch: int, workspace: torch.Tensor) -> None:
    heads, kv_heads, rows, _ = MODELS[model]
    per_item = pages_for(CONTEXT)
    kv = torch.randn(batch * per_item + 1, 2, PAGE, kv_heads, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
    tables = [list(range(1 + i * per_item, 1 + (i + 1) * per_item)) for i in range(batch)]
    layout = AttentionLayout.build([rows] * batch, [CONTEXT] * batch, tables)
    # the same items with their KV one page shorter: a different plan of the same shape
    other = AttentionLayout.build([rows] * batch, [CONTEXT - PAGE] * batch, tables)
    q = torch.randn(batch * rows, heads, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
    bound = batch * CONTEXT * 2 * kv_heads * HEAD_DIM * 2 / (TB_PER_S * 1e9)  # ms
    eager = FlashInferAttention(heads, kv_heads, HEAD_DIM, dtype=torch.bfloat16)
    eager.plan(layout)
    reference = eager.run(q, kv)
    group = heads // kv_heads
    entries = max(0, batch * rows - batch + 1 - TILE_ROWS // group) if rows <= TILE_ROWS // group else 0
    variants: dict[str, tuple[FlashInferAttention, list[AttentionLayout]]] = {
        "eager": (eager, [layout, other])
    }
    for name, exact, pad in (("graph", False, entries), ("exact", True, 0)):
        backend = FlashInferAttention(
            heads,
            kv_heads,
            HEAD_DIM,
            dtype=torch.bfloat16,
            cuda_graph_batch=batch + pad,
            max_pages=len(layout.kv_indices) + pad,
            workspace=workspace,
            exact_grid=exact,
        )
        variants[name] = (backend, [padded(layout, pad), padded(other, pad)])
    for parts in (2, 4):  # each item's rows as sub-items over its whole KV
        cut = subitem_rows(rows, parts)
        if cut[0] * group < 16:
            continue
        tables_cut = [table for table in tables for _ in cut]
        layouts = [
            AttentionLayout.build(cut * batch, [length] * len(tables_cut), tables_cut)
            for length in (CONTEXT, CONTEXT - PAGE)
        ]
        backend = FlashInferAttention(
            heads,
            kv_heads,
            HEAD_DIM,
            dtype=torch.bfloat16,
            cuda_graph_batch=len(tables_cut),
            max_pages=len(layouts[0].kv_indices),
            workspace=workspace,
            exact_grid=True,
        )
        variants[f"exact/{parts}"] = (backend, layouts)
    for name, (backend, layouts) in variants.items():
        first, replan = plan_ms(backend, layouts)
        backend.plan(layouts[0])
        out = backend.run(q, kv)
        error = ((out.float() - reference.float()).norm() / reference.float().norm()).item()
        ms = graph_ms(functools.partial(backend.run, q, kv))
        print(
            f"attention {model} B={batch:2d} {name:>7}: {ms:.4f} ms (x{ms / bound:.2f} of KV read), "
            f"err {error:.1e}; plan host {first:.2f} ms first, {replan:.3f} ms replan",
            flush=True,
        )


def projections(model: str, tunable: bool) -> None:
    _, _, rows, shapes = MODELS[model]
    for batch in (4, 8, 16, 32):
        m = batch * rows
        for name, (k, n) in shapes.items():
            w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda") / k**0.5
            x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
            bound = n * k * 2 / (TB_PER_S * 1e9)  # ms
            plain = graph_ms(functools.partial(F.linear, x, w))
            line = f"linear {model} M={m:4d} {name:>7}: {plain:.4f} ms (x{plain / bound:.2f})"
            if tunable:
                torch.cuda.tunable.enable(True)
                torch.cuda.tunable.tuning_enable(True)
                F.linear(x, w)  # tunes this shape
                torch.cuda.tunable.tuning_enable(False)
                tuned = graph_ms(functools.partial(F.linear, x, w))
                torch.cuda.tunable.enable(False)
                line += f", tuned {tuned:.4f} ms (x{tuned / bound:.2f})"
            print(line, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tunable", action="store_true", help="also time TunableOp-tuned projections")
    args = parser.parse_args()
    torch.manual_seed(0)
    workspace = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")  # partials of padded graph plans
    for model in MODELS:
        for batch in BATCHES:
            attention(model, batch, workspace)
    for model in MODELS:
        projections(model, args.tunable)
    if args.tunable:
        print("tunable:", str(torch.cuda.tunable.get_results())[:2000])


if __name__ == "__main__":
    main()
