"""Where LLaDA-8B's decode iterations lose time on the GPU: two probes behind issue 3's decode target.

Run on the accelerator machine (FlashInfer installed): `python -m benchmarks.decode_probe`.

1. Attention of B decode items (32 query rows each over 1819 cached positions, 32 heads, head_dim 128),
   one layer, planned three ways: eagerly (FlashInfer sizes its query tile by the mean item), in
   CUDA-graph mode (it sizes the tile for one item holding every row: 128 once B >= 3), and in CUDA-graph
   mode with zero-row padding entries appended until "every row in one item" fits a 64-row tile. Each is
   checked against the eager output and timed against the bound of reading the layer's KV once.
2. The projections at M query rows: `F.linear(x, W)` against the transposed product `(W @ x.T).T`, each
   against the bound of reading W once.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from executor.attention import AttentionLayout
from executor.flashinfer_backend import FlashInferAttention
from sangam.hardware import PAGE, pages_for

HEADS, HEAD_DIM, CONTEXT, ROWS = 32, 128, 1819, 32
TB_PER_S = 4.3
SHAPES = {"qkv": (4096, 12288), "o": (4096, 4096), "gate_up": (4096, 24576), "down": (12288, 4096)}


def time_ms(fn: object, repeats: int = 50) -> float:
    assert callable(fn)
    for _ in range(5):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeats


def padded(layout: AttentionLayout, entries: int) -> AttentionLayout:
    """`layout` with `entries` extra items of no query rows, each over one token of page 0."""
    extra = torch.arange(1, entries + 1, dtype=torch.int32)
    return AttentionLayout(
        qo_indptr=torch.cat([layout.qo_indptr, layout.qo_indptr[-1] + 0 * extra]),
        kv_indptr=torch.cat([layout.kv_indptr, layout.kv_indptr[-1] + extra]),
        kv_indices=torch.cat([layout.kv_indices, torch.zeros(entries, dtype=torch.int32)]),
        kv_last_page_len=torch.cat([layout.kv_last_page_len, torch.ones(entries, dtype=torch.int32)]),
    )


def attention(batch: int) -> None:
    per_item = pages_for(CONTEXT)
    kv = torch.randn(batch * per_item + 1, 2, PAGE, HEADS, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
    tables = [list(range(1 + i * per_item, 1 + (i + 1) * per_item)) for i in range(batch)]
    layout = AttentionLayout.build([ROWS] * batch, [CONTEXT] * batch, tables)
    q = torch.randn(batch * ROWS, HEADS, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
    bound = batch * CONTEXT * 2 * HEADS * HEAD_DIM * 2 / (TB_PER_S * 1e9)
    eager = FlashInferAttention(HEADS, HEADS, HEAD_DIM, dtype=torch.bfloat16)
    eager.plan(layout)
    reference = eager.run(q, kv)
    pad = max(0, batch * ROWS - 63 - batch)  # then total rows - items + 1 <= 64
    variants = {"eager": (eager, layout)}
    workspace = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    for name, plan in (("graph", layout), (f"graph+{pad}pad", padded(layout, pad))):
        items = plan.num_items
        backend = FlashInferAttention(
            HEADS,
            HEADS,
            HEAD_DIM,
            dtype=torch.bfloat16,
            cuda_graph_batch=items,
            max_pages=len(plan.kv_indices),
            workspace=workspace,  # split-KV partials are sized by the padded item count
        )
        backend.plan(plan)
        variants[name] = (backend, plan)
    for name, (backend, _) in variants.items():
        out = backend.run(q, kv)
        error = ((out.float() - reference.float()).norm() / reference.float().norm()).item()
        ms = time_ms(lambda backend=backend: backend.run(q, kv))
        print(
            f"attention B={batch:2d} {name:>14}: {ms:.3f} ms (x{ms / bound:.2f} of KV read), err {error:.1e}"
        )


def projections(rows: int) -> None:
    for name, (k, n) in SHAPES.items():
        w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda") / k**0.5
        x = torch.randn(rows, k, dtype=torch.bfloat16, device="cuda")
        bound = n * k * 2 / (TB_PER_S * 1e9)
        plain = time_ms(lambda w=w, x=x: F.linear(x, w))
        swapped = time_ms(lambda w=w, x=x: torch.mm(w, x.t()).t())
        error = (
            (torch.mm(w, x.t()).t() - F.linear(x, w)).float().norm() / F.linear(x, w).float().norm()
        ).item()
        print(
            f"linear M={rows:4d} {name:>7}: F.linear {plain:.3f} ms (x{plain / bound:.2f}), "
            f"W@x.T {swapped:.3f} ms (x{swapped / bound:.2f}), rel diff {error:.1e}"
        )


def main() -> None:
    torch.manual_seed(0)
    for batch in (4, 8, 16, 32):
        attention(batch)
    for rows in (128, 256, 512, 1024):
        projections(rows)


if __name__ == "__main__":
    main()
