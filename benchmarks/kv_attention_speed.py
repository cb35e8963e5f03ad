"""Attention alone over the paged KV of decode items, by query and KV dtype (one GPU, FlashInfer's fa2).

Run on the accelerator machine, from the repository root (FlashInfer installed):

    python -m benchmarks.kv_attention_speed [--models llada dream] [--items 8 32] [--context 1819]

For each model's attention shape (LLaDA-8B: 32 query and 32 KV heads; Dream-7B: 28 and 4; head_dim 128) and
each count of decode items (each forwarding its block's rows over `--context` cached positions, pages in
random order), one layer's `FlashInferAttention.run` is timed, captured 20 times in a CUDA graph, as the
decode graphs run it (`exact`: an unsplit grid, `split`: FlashInfer's split-KV plan), for these pairs of
query / KV dtype: bf16 / bf16 (the bf16 executor), bf16 / fp8 (`--kv-cache-dtype fp8` as served: the
queries cast to fp16 inside `run`, `flashinfer_backend.query_dtype`) and fp16 / fp16. `--fa3` adds
FlashInfer's Hopper (fa3) kernels, eagerly timed, for bf16 / bf16 and for FP8 queries over FP8 pages
(scales 1), as a probe: the executor does not use them. `page` rows time `Fp8PageAttention` (the Triton
kernel the decode graphs run over FP8 pages: bf16 queries, fp16 inside), graphed, at its defaults;
`--page-sweep` adds a grid of its packed query rows per program, KV step, splits and grid order (labelled
`mM nN wW sS xK`, `hf` where programs launched together take one item's KV heads), then its pipeline's
depth (stages) in either order. Each row gives us per call, the KV read rate (GB/s; bytes of the pages
read) and the output's relative error against bf16 / bf16 over the same values (||o - o_ref|| / ||o_ref||).
Only stdout is written.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import threading
from collections.abc import Callable

import torch

from benchmarks.executor_speed import graphed_ms, time_ms
from executor.model.attention import AttentionLayout
from executor.model.config import Family, full_size
from executor.model.flashinfer_backend import FlashInferAttention
from executor.model.fp8 import FP8
from sangam.hardware import BLOCK, PAGE, pages_for

PAIRS = {  # label: (query dtype, KV dtype)
    "bf16/bf16": (torch.bfloat16, torch.bfloat16),
    "bf16/fp8": (torch.bfloat16, FP8),
    "fp16/fp16": (torch.float16, torch.float16),
}
CALLS = 20


def warm_up(heads: int, kv_heads: int) -> None:
    """Compile every (q, KV) module at once, in threads (each build is its own ninja process)."""

    def build(q_dtype: torch.dtype, kv_dtype: torch.dtype) -> None:
        backend = FlashInferAttention(heads, kv_heads, 128, dtype=q_dtype, kv_dtype=kv_dtype)
        kv = torch.randn(2, 2, PAGE, kv_heads, 128, device="cuda").to(kv_dtype)
        backend.plan(AttentionLayout.build([3], [20], [[0, 1]]))
        backend.run(torch.randn(3, heads, 128, device="cuda", dtype=q_dtype), kv)

    torch.zeros(1, device="cuda")
    threads = [threading.Thread(target=build, args=pair) for pair in PAIRS.values()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def decodes(
    family: Family, items: int, context: int, generator: torch.Generator
) -> tuple[AttentionLayout, torch.Tensor, torch.Tensor]:
    """The layout of `items` decode items over `context` positions each (pages in random order), their
    fp32 pages and queries."""
    shape = full_size(family).shape
    rows = BLOCK + full_size(family).logit_shift
    per_item = pages_for(context)
    order = torch.randperm(items * per_item, generator=generator).tolist()
    tables = [order[i * per_item : (i + 1) * per_item] for i in range(items)]
    layout = AttentionLayout.build([rows] * items, [context] * items, tables)
    kv32 = torch.randn(items * per_item, 2, PAGE, shape.kv_heads, shape.head_dim, generator=generator)
    return layout, kv32, torch.randn(items * rows, shape.heads, shape.head_dim, generator=generator)


def bench(family: Family, items: int, context: int, generator: torch.Generator, sweep: bool) -> None:
    shape = full_size(family).shape
    heads, kv_heads, dim = shape.heads, shape.kv_heads, shape.head_dim
    layout, kv32, q32 = decodes(family, items, context, generator)
    per_item = pages_for(context)
    kv_by = {
        d: kv32.to(torch.float16 if d == FP8 else d).to(d).cuda()
        for d in (torch.bfloat16, torch.float16, FP8)
    }
    kv_bytes = items * context * 2 * kv_heads * dim
    workspace = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
    reference: torch.Tensor | None = None
    for label, (q_dtype, kv_dtype) in PAIRS.items():
        q = q32.to(q_dtype).cuda()
        kv = kv_by[kv_dtype]
        for mode in ("exact", "split"):
            try:
                backend = FlashInferAttention(
                    heads,
                    kv_heads,
                    dim,
                    dtype=q_dtype,
                    kv_dtype=kv_dtype,
                    cuda_graph_batch=items,
                    max_pages=items * per_item,
                    exact_grid=mode == "exact",
                    workspace=workspace,  # Dream's 32 items split past the executor's 128 MiB
                )
                backend.plan(layout)
                us = graphed_ms(functools.partial(backend.run, q, kv), calls=CALLS) * 1e3
                out = backend.run(q, kv).float()
            except Exception as error:  # a mode FlashInfer refuses for this shape: say so, go on
                print(f"{family.value:<6} {items:>3} {label:<10} {mode:<6} failed: {error}", flush=True)
                continue
            if reference is None:
                reference = out
            rel = float((out - reference).norm() / reference.norm())
            rate = kv_bytes * kv_by[kv_dtype].element_size() / (us * 1e-6) / 1e9
            print(
                f"{family.value:<6} {items:>3} {context:>5} {label:<10} {mode:<6} {us:>8.1f} {rate:>7.0f} "
                f"{rel:>8.4f}",
                flush=True,
            )
    assert reference is not None
    page_rows(family, layout, q32.to(torch.bfloat16).cuda(), kv_by[FP8], reference, sweep)


# (packed query rows a program holds, KV step, warps, stages, splits, heads first); 8 warps ran slower in
# every case of an earlier sweep (docs/executor-performance.md, the fifth round)
PAGE_CONFIGS = tuple(
    (m, n, 4, 3, x, h) for m in (32, 64, 128) for n in (64, 128) for x in (1, 2, 4, 8) for h in (False, True)
)


def page_rows(
    family: Family,
    layout: AttentionLayout,
    q: torch.Tensor,
    kv: torch.Tensor,
    reference: torch.Tensor,
    sweep: bool,
) -> None:
    """`Fp8PageAttention` over the FP8 pages, graphed: its defaults, then (`sweep`) other settings."""
    from executor.model.fp8_attention import Fp8PageAttention

    shape = full_size(family).shape
    items, context = layout.num_items, layout.kv_lens[0]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    default = Fp8PageAttention(
        shape.heads, shape.kv_heads, shape.head_dim, items=items, rows=len(q) // items,
        max_pages=len(kv), device="cuda", multiprocessors=sms,
    )  # fmt: skip
    settings = [
        (default.block_m, default.block_n, default.warps, default.stages, default.splits, default.heads_first)
    ]
    if sweep:  # the grid above, then the pipeline's depth in either order at the defaults
        settings += PAGE_CONFIGS
        settings += [(*settings[0][:3], s, settings[0][4], h) for s in (2, 4) for h in (False, True)]
    kv_bytes = items * context * 2 * shape.kv_heads * shape.head_dim
    packed = shape.heads // shape.kv_heads * (len(q) // items)
    for block_m, block_n, warps, stages, splits, heads_first in dict.fromkeys(settings):
        attention = Fp8PageAttention(
            shape.heads, shape.kv_heads, shape.head_dim, items=items, rows=len(q) // items,
            max_pages=len(kv), device="cuda", multiprocessors=sms, splits=splits,
        )  # fmt: skip
        attention.block_n, attention.warps, attention.stages = block_n, warps, stages
        attention.heads_first = heads_first
        attention.block_m, attention.m_tiles = block_m, -(-packed // block_m)
        label = f"m{block_m} n{block_n} w{warps} s{stages} x{splits}{' hf' if heads_first else ''}"
        try:
            attention.plan(layout)
            us = graphed_ms(functools.partial(attention.run, q, kv), calls=CALLS) * 1e3
            out = attention.run(q, kv).float()
        except Exception as error:  # a setting Triton cannot build: say so, go on
            print(f"{family.value:<6} {items:>3} page {label} failed: {str(error)[:200]}", flush=True)
            continue
        rel = float((out - reference).norm() / reference.norm())
        rate = kv_bytes / (us * 1e-6) / 1e9
        print(
            f"{family.value:<6} {items:>3} {context:>5} {'page':<10} {label:<16} {us:>8.1f} {rate:>7.0f} "
            f"{rel:>8.4f}",
            flush=True,
        )


def eager_us(fn: Callable[[], object]) -> float:
    """Median us of one `fn` call, timed over `CALLS` back-to-back calls."""
    return time_ms(lambda: [fn() for _ in range(CALLS)], 3, 10) * 1e3 / CALLS


def fa3_rows(family: Family, items: int, context: int, generator: torch.Generator) -> None:
    """FlashInfer's fa3 (Hopper) paged prefill, bf16 / bf16 and FP8 queries over FP8 pages, bf16 out."""
    flashinfer = importlib.import_module("flashinfer")
    shape = full_size(family).shape
    heads, kv_heads, dim = shape.heads, shape.kv_heads, shape.head_dim
    layout, kv32, q32 = decodes(family, items, context, generator)
    reference = FlashInferAttention(heads, kv_heads, dim, dtype=torch.bfloat16)
    reference.plan(layout)
    expected = reference.run(q32.to(torch.bfloat16).cuda(), kv32.to(torch.bfloat16).cuda()).float()
    kv_bytes = items * context * 2 * kv_heads * dim
    for label, dtype in (("bf16/bf16", torch.bfloat16), ("fp8/fp8", FP8)):
        try:
            wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
                torch.empty(256 << 20, dtype=torch.uint8, device="cuda"), "NHD", backend="fa3"
            )
            wrapper.plan(
                layout.qo_indptr.cuda(), layout.kv_indptr.cuda(), layout.kv_indices.cuda(),
                layout.kv_last_page_len.cuda(), heads, kv_heads, dim, PAGE, causal=False,
                q_data_type=dtype, kv_data_type=dtype, o_data_type=torch.bfloat16,
            )  # fmt: skip
            q, kv = q32.to(dtype).cuda(), kv32.to(dtype).cuda()
            out = torch.empty(q.shape, dtype=torch.bfloat16, device="cuda")
            us = eager_us(functools.partial(wrapper.run, q, kv, out=out))
            rel = float((out.float() - expected).norm() / expected.norm())
        except Exception as error:  # a probe: say what FlashInfer refused
            print(f"{family.value:<6} {items:>3} fa3 {label:<10} failed: {str(error)[:300]}", flush=True)
            continue
        rate = kv_bytes * kv.element_size() / (us * 1e-6) / 1e9
        print(
            f"{family.value:<6} {items:>3} {context:>5} {'fa3 ' + label:<10} {'eager':<6} {us:>8.1f} "
            f"{rate:>7.0f} {rel:>8.4f}",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", nargs="+", default=["llada", "dream"], choices=["llada", "dream"])
    parser.add_argument("--items", nargs="+", type=int, default=[8, 32])
    parser.add_argument("--context", type=int, default=1819)
    parser.add_argument("--fa3", action="store_true", help="also probe FlashInfer's fa3 kernels")
    parser.add_argument("--page-sweep", action="store_true", help="sweep Fp8PageAttention's settings")
    args = parser.parse_args()
    generator = torch.Generator().manual_seed(0)
    print(f"{'model':<6} {'B':>3} {'ctx':>5} {'q/kv':<10} {'grid':<6} {'us':>8} {'GB/s':>7} {'rel.err':>8}")
    for name in args.models:
        family = Family(name)
        shape = full_size(family).shape
        warm_up(shape.heads, shape.kv_heads)
        for items in args.items:
            bench(family, items, args.context, generator, args.page_sweep)
            if args.fa3:
                fa3_rows(family, items, args.context, generator)


if __name__ == "__main__":
    main()
