"""One forward for a whole microbatch: prefills and decodes packed together over the paged KV cache."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Sequence

import torch
from torch import Tensor

from executor.model.attention import AttentionBackend
from executor.model.fp8 import FP8, FP8_MAX, fp8_page_kernels
from executor.model.kv_cache import KVSlots, PagedKVCache, as_bits
from executor.model.layers import fused_kernels
from executor.model.microbatch import ForwardItem, MicrobatchPlan, Phase, PrefillTail, plan_microbatch
from executor.model.piecewise_graphs import PiecewiseGraphs
from executor.model.prefill_attention import PrefillAttention
from executor.model.transformer import Transformer
from sangam.hardware import BLOCK, PAGE


class PagedAttention:
    """The model's `LayerAttention` for one planned microbatch: store this forward's K/V, then attend.

    Writing before attending lets a decode's block queries see the block's fresh K/V (Fast-dLLM dual cache)
    while every other position keeps what its last prefill wrote. With a `tail` (the microbatch's trailing
    prefills) those rows attend over this forward's own K/V through `prefill`, the rows before them over the
    pages through `backend`.
    """

    def __init__(
        self,
        cache: PagedKVCache,
        backend: AttentionBackend,
        plan: MicrobatchPlan,
        prefill: PrefillAttention | None = None,
        tail: PrefillTail | None = None,
    ) -> None:
        if tail is not None and prefill is None:
            raise ValueError("a prefill tail needs a PrefillAttention")
        self.cache, self.backend, self.prefill, self.tail = cache, backend, prefill, tail
        self._store = SlotStore(plan.slots)

    def __call__(self, layer: int, q: Tensor, k: Tensor, v: Tensor, out: Tensor | None = None) -> Tensor:
        """The layer's attention output (T, heads, d), written into `out` when given."""
        kv = self.cache.layers[layer]
        self._store(kv, k, v)
        if self.tail is None or self.prefill is None:
            attended = self.backend.run(q, kv)
            return attended if out is None else out.copy_(attended)
        start = self.tail.start
        out = torch.empty_like(q) if out is None else out
        if start:
            out[:start] = self.backend.run(q[:start], kv)
        self.prefill.run(q[start:], k[start:], v[start:], out[start:])
        return out


class SlotStore:
    """Stores every packed row's K and V, (T, kv_heads, head_dim) each, at its slot of one layer.

    Built once per microbatch. On a GPU (fp16/bf16, FlashInfer present) one `append_paged_kv_cache`
    kernel stores K and V from their strided views of the qkv output: the plan's slots become a one-page-
    per-row table (row i at offset i * PAGE + its page offset of "request" 0). Into FP8 pages on a GPU, one
    Triton kernel (`fp8_kernels.store_kv`) casts and stores both. Elsewhere (FP8 pages: clamped to +-448,
    then torch's cast) it is one `index_copy_` per K and V over the layer seen as
    `(pages * 2 * PAGE, kv_heads * head_dim)` rows: advanced indexing over (page, K/V, offset) took five
    times as long (H200: 3.6 ms against 0.7 ms per 2048-token LLaDA prefill).
    """

    def __init__(self, slots: KVSlots) -> None:
        self.slots = slots

    def __call__(self, kv_layer: Tensor, k: Tensor, v: Tensor) -> None:
        fused = fused_kernels(k)
        if fused is not None and k.dtype == v.dtype == kv_layer.dtype:
            fused.append_paged_kv_cache(k, v, *self._row_table, kv_layer, *self._page_table)
            return
        k_rows, v_rows = self._rows
        kernels = fp8_page_kernels(kv_layer, k, v)
        if kernels is not None:
            kernels.store_kv(kv_layer, k_rows, k, v, PAGE)
            return
        _store_rows(kv_layer, k_rows, k)
        _store_rows(kv_layer, v_rows, v)

    @functools.cached_property
    def _row_table(self) -> tuple[Tensor, Tensor]:
        """Per row: its request (0) and position (row * PAGE + page offset), int32."""
        pages, offsets = self.slots.pages, self.slots.offsets
        rows = torch.arange(len(pages), device=pages.device)
        return torch.zeros_like(rows, dtype=torch.int32), (rows * PAGE + offsets).to(torch.int32)

    @functools.cached_property
    def _page_table(self) -> tuple[Tensor, Tensor, Tensor]:
        """Request 0's pages (one per row), page indptr and last-page length, int32."""
        pages = self.slots.pages  # built with device ops only: this may run under CUDA-graph capture
        bounds = torch.arange(2, dtype=torch.int32, device=pages.device) * len(pages)
        return pages.to(torch.int32), bounds, torch.full_like(bounds[:1], PAGE)

    @functools.cached_property
    def _rows(self) -> tuple[Tensor, Tensor]:
        """Rows of K and of V in the layer seen as (pages * 2 * PAGE, kv_heads * head_dim)."""
        k_rows = self.slots.pages * (2 * PAGE) + self.slots.offsets
        return k_rows, k_rows + PAGE


def _store_rows(kv_layer: Tensor, rows: Tensor, values: Tensor) -> None:
    """Copy `values` (W, kv_heads, head_dim) into rows `rows` of `kv_layer` seen as (-1, kv_heads * head_dim).

    Into FP8 pages the values saturate at +-448 first: torch 2.11's CUDA cast gave NaN past it (the H200
    machine's). The copy moves 8-byte words where the layout allows, else elements (FP8 ones as bytes: a
    bitwise copy either way): four times fewer elements for the elementwise index kernel than bf16 ones.
    """
    flat = as_bits(kv_layer).view(-1, kv_layer.shape[-2] * kv_layer.shape[-1])
    if kv_layer.dtype == FP8:
        values = values.float().clamp(-FP8_MAX, FP8_MAX)
    source = as_bits(values.to(kv_layer.dtype)).reshape(len(values), -1)
    if flat.element_size() < 8:
        with contextlib.suppress(RuntimeError):  # unless a stride or offset splits a word: copy elements
            flat, source = flat.view(torch.int64), source.view(torch.int64)
    flat.index_copy_(0, rows, source)


class ModelRunner:
    """Runs mixed prefill/decode microbatches of one model against one worker's paged KV cache.

    `backend` attends over the pages; `prefill`, when given, attends every prefill over its own K/V
    (`executor.model.prefill_attention`; without it they read their pages back): the forward then packs
    decodes first, so that the prefills form the microbatch's tail, and returns the logits in item order.
    With `pieces` the model body runs from its CUDA graphs where a bucket holds the microbatch
    (`executor.model.piecewise_graphs`).
    """

    def __init__(
        self,
        model: Transformer,
        cache: PagedKVCache,
        backend: AttentionBackend,
        prefill: PrefillAttention | None = None,
        pieces: PiecewiseGraphs | None = None,
    ) -> None:
        self.model, self.cache, self.backend = model, cache, backend
        self.prefill, self.pieces = prefill, pieces

    @torch.inference_mode()
    def forward(self, items: Sequence[ForwardItem]) -> Tensor:
        """Logits (len(items), BLOCK, vocab) for each item's 32 block positions, in item order.

        Every item's request must already hold its pages in the cache's pool (`pages_for(S)` of them),
        and a decode must follow a prefill of the same block on this cache (or a KV transfer into it).
        """
        if self.prefill is None:
            return self._forward(items)
        order = sorted(range(len(items)), key=lambda i: items[i].phase is Phase.PREFILL)  # stable
        logits = self._forward([items[i] for i in order])
        if order == list(range(len(items))):  # the engine's packing
            return logits
        restore = torch.empty(len(order), dtype=torch.long)
        restore[order] = torch.arange(len(order))
        return logits[restore.to(logits.device)]

    def _forward(self, items: Sequence[ForwardItem]) -> Tensor:
        tables = [self.cache.page_table(item.request_id) for item in items]
        shift, scratch = self.model.config.logit_shift, self.cache.scratch_page
        plan = plan_microbatch(items, tables, shift, scratch, self.model.device)
        prefill, tail = self.prefill, plan.prefill_tail
        if prefill is None or tail is None:
            self.backend.plan(plan.layout)
            attend = PagedAttention(self.cache, self.backend, plan)
        else:
            if tail.items < len(items):
                self.backend.plan(plan.layout.head(len(items) - tail.items))
            prefill.plan(tail.indptr)
            attend = PagedAttention(self.cache, self.backend, plan, prefill, tail)
        body = self.pieces.run(plan.tokens, plan.positions, attend) if self.pieces is not None else None
        if body is None:
            body = self.model.body(plan.tokens, plan.positions, attend)
        return self.model.head(*body, plan.head_rows).view(len(items), BLOCK, -1)
