"""CUDA graphs for decode-only microbatches: `GraphedModelRunner`, a drop-in for `ModelRunner`.

A decode step forwards each item's block (32 rows, 33 for Dream, whose head reads one row to the left) against
its cached KV. Its shape depends only on the number of items, so the whole model forward is captured once
per batch bucket (1, 2, 4, ..., 64 items) and replayed from static input buffers: the microbatch is padded to
the smallest bucket that holds it, and `forward` then costs one host-to-device copy, one FlashInfer `plan`
(on host CSR arrays, into the graph wrapper's fixed device buffers) and one graph launch, instead of a
thousand-odd kernel launches from Python.

Padding items decode a block of token 0 whose K/V go to `DUMMY_PAGES` reserved pages and which attends to
those pages only; the pages are taken from the worker's `PagePool` once, under the owner id `PADDING_OWNER`,
so page accounting stays exact (the pool simply has two pages fewer to give). Padding rows never touch a
real request's pages and every real row's result is independent of them (attention is per item, every other
op per row).

Attention is planned one of two ways per bucket. Where an unsplit grid (one CTA per plan item, query tile
and KV head, each over its item's whole KV) fills the GPU, the bucket plans that exact grid, as FlashInfer
does outside graphs (`FlashInferAttention(exact_grid=True)`): its launch shape depends on the item count
only. To fill it, an item's rows may become 2 or 4 sub-items over the same KV, a smaller query tile each
(`unsplit_subitems`: on an H200, LLaDA-8B from 2 items, as 2 sub-items up to 4 items; Dream-7B from 8
items, as 4 sub-items up to 16). Per row the result is the same attention. Smaller buckets use FlashInfer's
CUDA-graph mode, which splits KV to fill the GPU but sizes its query tile as if every row of the batch
could sit in one item (total rows - items + 1); an MHA model's 32-row blocks would get a 128-row tile from
three items on and waste 3/4 of the attention math, so such a plan also carries `tile_entries(size)` empty
entries (no query rows, one KV token of a padding page) that bring that bound down to 64 rows and change
no output. Attention times per layer on an H200 are in `benchmarks/results/decode_probe-h200.txt`
(`python -m benchmarks.decode_probe`).

Over FP8 pages every bucket runs attention through `Fp8PageAttention` instead (a Triton kernel that reads the
pages at their byte rate, which FlashInfer's fa2 does not; `executor.model.fp8_attention`), one plan item
per decode item, with no sub-items and no tile entries.

Consecutive decode steps of one block forward the same items over the same KV: the bucket keeps the last
microbatch's positions, KV slots and attention layout, so such a step only copies its tokens, and its plan
is skipped (`FlashInferAttention.plan` sees the same layout).

Microbatches with a prefill, with more items than the largest bucket, or any microbatch when graphs are
disabled run eagerly through the wrapped `ModelRunner`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from executor.model.attention import AttentionBackend, AttentionLayout, TorchAttention, indptr
from executor.model.flashinfer_backend import (
    WORKSPACE_BYTES,
    FlashInferAttention,
    replans_supported,
    supports,
)
from executor.model.forward import ModelRunner, PagedAttention
from executor.model.fp8 import FP8, triton_module
from executor.model.kv_cache import KVSlots, PagedKVCache, as_bits
from executor.model.microbatch import ForwardItem, MicrobatchPlan, Phase
from executor.model.transformer import Transformer
from sangam.hardware import BLOCK, PAGE, pages_for

log = logging.getLogger(__name__)

# Graphs beat eager decodes at every size for both models on an H200 (benchmarks/executor_speed.py)
DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
PADDING_OWNER = -1  # the PagePool owner id of the pages padding items write to (request ids are >= 0)
DUMMY_PAGES = pages_for(BLOCK)  # a padding item's 32 block rows fill exactly these pages
FP8_PAGE_KERNEL = True  # False: FP8 pages through FlashInfer's fa2 too (benchmarks compare the two)
TILE_ROWS = 64  # the query tile FlashInfer should pick for a decode block of 32 (33) rows
_TOKENS, _POSITIONS, _SLOT_PAGES, _SLOT_OFFSETS = range(4)  # rows of a bucket's static index buffer


def query_tile(packed_rows: int) -> int:
    """FlashInfer fa2's query tile for items of `packed_rows` rows (query rows times query heads per KV
    head)."""
    return 16 if packed_rows <= 16 else TILE_ROWS if packed_rows <= TILE_ROWS else 2 * TILE_ROWS


def subitem_rows(rows: int, parts: int) -> list[int]:
    """An item's `rows` query rows cut into at most `parts` consecutive sub-items, all but the last equal."""
    size = -(-rows // parts)
    return [min(size, rows - start) for start in range(0, rows, size)]


def unsplit_subitems(items: int, rows: int, group: int, kv_heads: int, multiprocessors: int) -> int | None:
    """How many sub-items an unsplit attention grid cuts each item's rows into; None: a split grid is faster.

    An unsplit grid runs one CTA per (sub-)item, query tile and KV head over the item's whole KV, so its
    launch shape depends on the item count alone. Sub-items over the same KV multiply the CTAs, and the KV
    reads (the repeated ones mostly from L2), by their number. The choice: the fewest sub-items (1, 2 or 4,
    each of at least 16 packed rows, that is rows times `group` query heads per KV head) whose grid gives
    15/16 of the multiprocessors two CTAs each, else one each. On an H200 this picked the fastest of those
    grids and FlashInfer's split graph mode at every size of 1-32 items for both models
    (`python -m benchmarks.decode_probe`).
    """
    grids = []
    for parts in (1, 2, 4):
        cut = subitem_rows(rows, parts)
        packed = cut[0] * group
        if packed < 16:
            break
        grids.append((parts, items * len(cut) * -(-packed // query_tile(packed)) * kv_heads))
    for per_multiprocessor in (2, 1):
        for parts, ctas in grids:
            if 16 * ctas >= 15 * per_multiprocessor * multiprocessors:
                return parts
    return None


@dataclass(slots=True)
class _Bucket:
    """Everything one batch size replays: static inputs, its attention backend, the graph and its output."""

    size: int
    static: Tensor  # (4, size * rows) int64 on the device: tokens, positions, slot pages, slot offsets
    template: Tensor  # the same on the host, holding the padding values of all `size` items
    plan: MicrobatchPlan  # views of `static` plus the constant head rows
    backend: AttentionBackend
    graph: torch.cuda.CUDAGraph | None = None
    logits: Tensor | None = None  # the graph's output, (size * BLOCK, vocab)
    last: _Packed | None = None  # the last microbatch packed into this bucket


@dataclass(frozen=True, slots=True)
class _Packed:
    """What a microbatch's composition fixes: the host index buffer (all but tokens) and attention layout."""

    key: list[tuple[int, int, int]]  # (request id, block start, KV length) per item
    tables: list[list[int]]
    host: Tensor
    layout: AttentionLayout


class GraphedModelRunner:
    """`ModelRunner.forward` with decode-only microbatches replayed from CUDA graphs.

    Graphs are captured at construction (largest bucket first, sharing one memory pool) for `buckets`
    (default: `DEFAULT_BUCKETS`), which needs FlashInfer and fp16/bf16 on a CUDA device; elsewhere,
    or with `enabled=False`, every microbatch runs eagerly and no page is reserved. `capture=False` keeps the
    padded static path but runs it without graphs (debugging; it also runs on CPU). One graphed runner per
    `PagePool` (the padding pages have one owner id); `close()` gives them back and drops the graphs.
    """

    def __init__(
        self,
        runner: ModelRunner,
        *,
        buckets: Sequence[int] | None = None,
        enabled: bool = True,
        capture: bool | None = None,
        warmup: int = 2,
    ) -> None:
        self.runner = runner
        self.buckets = tuple(sorted(set(DEFAULT_BUCKETS if buckets is None else buckets)))
        if not self.buckets or self.buckets[0] < 1:
            raise ValueError(f"buckets must be positive batch sizes, got {buckets}")
        self.enabled = enabled
        self.shift = runner.model.config.logit_shift
        self.rows = BLOCK + self.shift  # query rows of one decode item
        shape = runner.model.config.shape
        self.group = shape.heads // shape.kv_heads  # FlashInfer packs a KV head's query heads as rows
        self.dummy_pages: list[int] = []
        device = runner.model.device
        self._multiprocessors = (
            torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 0
        )
        fp8_pages = bool(runner.cache.layers) and runner.cache.layers[0].dtype == FP8
        page_kernel = FP8_PAGE_KERNEL and fp8_pages and device.type == "cuda"
        self._page_kernel = triton_module("fp8_attention") if page_kernel else None
        self.capture_seconds = 0.0
        self._buckets: dict[int, _Bucket] = {}
        self._workspace: Tensor | None = None
        self.host_seconds: dict[str, float] = dict.fromkeys(("pack", "plan", "launch", "copy"), 0.0)
        self.replays = 0
        if enabled:
            self._setup(capture, warmup)

    @property
    def model(self) -> Transformer:
        return self.runner.model

    @property
    def cache(self) -> PagedKVCache:
        return self.runner.cache

    @property
    def backend(self) -> AttentionBackend:
        return self.runner.backend

    @property
    def captured(self) -> bool:
        return any(bucket.graph is not None for bucket in self._buckets.values())

    def bucket_for(self, items: Sequence[ForwardItem]) -> int | None:
        """The bucket a microbatch replays in, or None when it runs eagerly."""
        if not self._buckets or not items or len(items) > self.buckets[-1]:
            return None
        if any(item.phase is not Phase.DECODE for item in items):
            return None
        return next(size for size in self.buckets if size >= len(items))

    @torch.inference_mode()
    def forward(self, items: Sequence[ForwardItem]) -> Tensor:
        """Logits (len(items), BLOCK, vocab), exactly `ModelRunner.forward`'s contract and result."""
        size = self.bucket_for(items)
        if size is None:
            return self.runner.forward(items)
        bucket, n = self._buckets[size], len(items)
        start = time.perf_counter()
        layout = self._pack(items, bucket)
        packed = time.perf_counter()
        bucket.backend.plan(layout)
        planned = time.perf_counter()
        if bucket.graph is not None and bucket.logits is not None:
            bucket.graph.replay()
            logits = bucket.logits
        else:
            logits = self._run(bucket)
        launched = time.perf_counter()
        # A copy: the graph's output buffer is overwritten by the next replay of any bucket.
        result = logits[: n * BLOCK].view(n, BLOCK, -1).clone()
        self.host_seconds["pack"] += packed - start
        self.host_seconds["plan"] += planned - packed
        self.host_seconds["launch"] += launched - planned
        self.host_seconds["copy"] += time.perf_counter() - launched
        self.replays += 1
        return result

    def _pack(self, items: Sequence[ForwardItem], bucket: _Bucket) -> AttentionLayout:
        """Copy the items' rows into the bucket's static buffers; their padded attention layout.

        The same rows, positions and slots `plan_microbatch` gives a decode, built with a handful of host ops
        for the whole batch instead of a dozen per item, and only tokens when the composition is the last one.
        """
        tables = [self.cache.page_table(item.request_id) for item in items]
        key = [(item.request_id, item.block_start, item.seq_len) for item in items]
        last = bucket.last
        if last is None or last.key != key or last.tables != tables:
            last = bucket.last = self._index(items, tables, bucket, key)
        rows, shift = self.rows, self.shift
        spans = [item.tokens[item.block_start - shift : item.block_start - shift + rows] for item in items]
        torch.cat(spans, out=last.host[_TOKENS, : len(items) * rows])
        # from pageable memory the copy returns once `host` is staged, so the next pack may refill it
        bucket.static.copy_(last.host, non_blocking=True)
        return last.layout

    def _index(
        self,
        items: Sequence[ForwardItem],
        tables: list[list[int]],
        bucket: _Bucket,
        key: list[tuple[int, int, int]],
    ) -> _Packed:
        """Positions, KV slots and the padded attention layout of a composition."""
        n, rows, shift, size = len(items), self.rows, self.shift, bucket.size
        host = bucket.template.clone()
        packed = host[:, : n * rows].view(4, n, rows)
        starts = [item.block_start - shift for item in items]
        if min(starts) < 0:
            raise ValueError("a shifted head needs a token left of the block")
        first_rows = torch.tensor(starts)
        packed[_POSITIONS] = first_rows[:, None] + torch.arange(rows)
        slot_pages = [
            [table[position // PAGE] for position in range(item.block_start, item.block_start + BLOCK)]
            for item, table in zip(items, tables, strict=True)
        ]
        # a shifted item's left row keeps the template's scratch slot
        packed[_SLOT_PAGES, :, shift:] = torch.tensor(slot_pages)
        packed[_SLOT_OFFSETS, :, shift:] = ((first_rows + shift)[:, None] + torch.arange(BLOCK)) % PAGE

        counts = [pages_for(item.seq_len) for item in items]
        if any(len(table) < count for table, count in zip(tables, counts, strict=True)):
            raise ValueError("a page table holds fewer pages than its KV length needs")
        tail_counts, tail_pages, tail_last = self._padding_tail(size - n, size)
        parts = len(self.item_rows(size))  # each item's sub-items attend to its whole KV
        pages = [page for table, count in zip(tables, counts, strict=True) for page in table[:count] * parts]
        last = [item.seq_len - (count - 1) * PAGE for item, count in zip(items, counts, strict=True)]
        layout = AttentionLayout(
            qo_indptr=bucket.plan.layout.qo_indptr,
            kv_indptr=indptr([count for count in counts for _ in range(parts)] + tail_counts),
            kv_indices=torch.tensor(pages + tail_pages, dtype=torch.int32),
            kv_last_page_len=torch.tensor(
                [length for length in last for _ in range(parts)] + tail_last, dtype=torch.int32
            ),
        )
        return _Packed(key, [list(table) for table in tables], host, layout)

    def _padding_tail(self, pad: int, size: int) -> tuple[list[int], list[int], list[int]]:
        """Page counts, pages and last-page lengths of `pad` padding items (once per sub-item), then bucket
        `size`'s tile entries (one KV token of a padding page each)."""
        entries, parts = self.tile_entries(size), pad * len(self.item_rows(size))
        return (
            [DUMMY_PAGES] * parts + [1] * entries,
            self.dummy_pages * parts + self.dummy_pages[:1] * entries,
            [BLOCK - (DUMMY_PAGES - 1) * PAGE] * parts + [1] * entries,
        )

    def tile_entries(self, size: int) -> int:
        """Empty entries that make FlashInfer's graph-mode row bound (rows - plan items + 1) fit `TILE_ROWS`.

        None for an exact grid, and none where one item's packed rows exceed the tile anyway (GQA with a large
        group, like Dream-7B).
        """
        tile = TILE_ROWS // self.group
        if self.rows > tile or self.exact_grid(size) or self._page_kernel is not None:
            return 0
        return max(0, size * self.rows - size + 1 - tile)

    def exact_grid(self, size: int) -> bool:
        """Whether bucket `size` plans an exact, unsplit grid (`unsplit_subitems`)."""
        return self._subitems(size) is not None

    def item_rows(self, size: int) -> list[int]:
        """The query rows of the plan items one decode item becomes in bucket `size`: its sub-items."""
        return subitem_rows(self.rows, self._subitems(size) or 1)

    def _subitems(self, size: int) -> int | None:
        if self._multiprocessors == 0 or not replans_supported() or self._page_kernel is not None:
            return None
        kv_heads = self.runner.model.config.shape.kv_heads
        return unsplit_subitems(size, self.rows, self.group, kv_heads, self._multiprocessors)

    def host_milliseconds(self, reset: bool = True) -> dict[str, float]:
        """Mean host time per replay spent packing, in FlashInfer's plan, launching the graph and queueing the
        copy of its logits."""
        mean = {key: value / max(self.replays, 1) * 1e3 for key, value in self.host_seconds.items()}
        if reset:
            self.host_seconds = dict.fromkeys(self.host_seconds, 0.0)
            self.replays = 0
        return mean

    def close(self) -> None:
        """Drop the graphs and give the padding pages back to the pool."""
        self._buckets.clear()
        self._workspace = None
        if self.dummy_pages:
            self.cache.pool.release(PADDING_OWNER)
            self.dummy_pages = []

    # -- construction -----------------------------------------------------------------------------------

    @torch.inference_mode()
    def _setup(self, capture: bool | None, warmup: int) -> None:
        device, dtype = self.model.device, self.model.dtype
        graphable = supports(device, dtype, self.cache.layers[0].dtype)
        if capture is None and not graphable:
            log.info(
                "no CUDA graphs without FlashInfer and fp16/bf16 on a CUDA device: every forward is eager"
            )
            return
        capture = graphable if capture is None else capture
        if capture and not graphable:
            raise ValueError("capturing decode graphs needs FlashInfer and fp16/bf16 on a CUDA device")
        self.dummy_pages = self.cache.pool.allocate(PADDING_OWNER, DUMMY_PAGES)
        pages = torch.tensor(self.dummy_pages, device=device)
        for layer in self.cache.layers:  # padding attends to these before any real K/V: keep them finite
            as_bits(layer).index_fill_(0, pages, 0)  # all-zero bits are 0.0 in FP8 too
        start = time.perf_counter()
        self._workspace = (
            torch.empty(self._workspace_bytes(self.buckets[-1]), dtype=torch.uint8, device=device)
            if graphable and self._page_kernel is None
            else None
        )
        pool = torch.cuda.graph_pool_handle() if capture else None
        for size in reversed(self.buckets):  # largest first: later graphs reuse its pool memory
            bucket = self._bucket(size, graphable)
            if capture:
                self._capture(bucket, pool, warmup)
            self._buckets[size] = bucket
        if capture:
            torch.cuda.synchronize(device)
        self.capture_seconds = time.perf_counter() - start
        log.info("decode graphs for buckets %s ready in %.1f s", self.buckets, self.capture_seconds)

    def _bucket(self, size: int, flashinfer: bool) -> _Bucket:
        device, rows, shift = self.model.device, self.rows, self.shift
        block = torch.arange(BLOCK)
        template = torch.zeros(4, size, rows, dtype=torch.long)  # tokens 0 at position 0
        template[_SLOT_PAGES, :, :shift] = self.cache.scratch_page  # offset 0
        template[_SLOT_PAGES, :, shift:] = torch.tensor(self.dummy_pages).repeat_interleave(PAGE)
        template[_SLOT_OFFSETS, :, shift:] = block % PAGE
        template = template.view(4, size * rows)
        static = template.to(device)
        plan = MicrobatchPlan(
            tokens=static[_TOKENS],
            positions=static[_POSITIONS],
            layout=self._padding_layout(size),
            slots=KVSlots(static[_SLOT_PAGES], static[_SLOT_OFFSETS]),
            head_rows=(torch.arange(size)[:, None] * rows + block).flatten().to(device),
        )
        backend: AttentionBackend
        shape = self.model.config.shape
        if flashinfer and self._page_kernel is not None:
            backend = self._page_kernel.Fp8PageAttention(
                shape.heads,
                shape.kv_heads,
                shape.head_dim,
                items=size,
                rows=rows,
                max_pages=self.cache.pool.capacity + DUMMY_PAGES * size,
                device=device,
                multiprocessors=self._multiprocessors,
            )
        elif flashinfer:
            entries, parts = self.tile_entries(size), len(self.item_rows(size))
            backend = FlashInferAttention.for_model(
                self.model.config,
                dtype=self.model.dtype,
                kv_dtype=self.cache.layers[0].dtype,
                device=device,
                workspace=self._workspace,
                cuda_graph_batch=size * parts + entries,
                max_pages=(self.cache.pool.capacity + DUMMY_PAGES * size) * parts + entries,
                exact_grid=self.exact_grid(size),
            )
        else:
            backend = TorchAttention()
        return _Bucket(size, static, template, plan, backend)

    def _workspace_bytes(self, size: int) -> int:
        """FlashInfer's float workspace for a graph of `size` items, an upper bound of what `plan` takes.

        In CUDA-graph mode FlashInfer always splits KV and sizes its partial outputs for a padded number of
        work tiles (one more per entry, empty ones included), heads * tiles * cta_tile_q * (head_dim + 1)
        fp32 values: over 128 MiB (the eager workspace) for Dream at 32 items.
        """
        shape = self.model.config.shape
        items = size + self.tile_entries(size)  # plan entries, empty ones included
        sms = torch.cuda.get_device_properties(self.model.device).multi_processor_count
        need = 0
        for tile in (16, 64, 128):  # FlashInfer picks the CTA tile from the rows: take the worst
            tiles = max(2 * sms // shape.kv_heads, -(-size * self.rows * self.group // tile) + items - 1)
            need = max(need, shape.heads * tiles * tile * (shape.head_dim + 1) * 4)
        return max(need + (16 << 20), WORKSPACE_BYTES)

    def _padding_layout(self, size: int) -> AttentionLayout:
        """`size` padding items, each a block of 32 positions over the dummy pages, then the tile entries."""
        counts, pages, last = self._padding_tail(size, size)
        return AttentionLayout(
            qo_indptr=indptr(self.item_rows(size) * size + [0] * self.tile_entries(size)),
            kv_indptr=indptr(counts),
            kv_indices=torch.tensor(pages, dtype=torch.int32),
            kv_last_page_len=torch.tensor(last, dtype=torch.int32),
        )

    def _run(self, bucket: _Bucket) -> Tensor:
        plan = bucket.plan
        attend = PagedAttention(self.cache, bucket.backend, plan)
        return self.model(plan.tokens, plan.positions, attend, plan.head_rows)

    def _capture(self, bucket: _Bucket, pool: Any, warmup: int) -> None:
        bucket.static.copy_(bucket.template)
        bucket.backend.plan(bucket.plan.layout)  # all padding: capture touches the dummy pages only
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up off the capture: lazy allocations, autotuning, caches
            for _ in range(warmup):
                self._run(bucket)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            bucket.logits = self._run(bucket)
        bucket.graph = graph
