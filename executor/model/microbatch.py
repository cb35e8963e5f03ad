"""Packing one microbatch of prefills and decodes into a single ragged forward.

Query span per item (positions are absolute; `shift` is the model's logit shift, 1 for Dream):

- prefill: all S positions; K/V written for all S; it is also the block's first denoising forward.
- decode: [block_start - shift, block_start + 32); K/V written for the block's 32 positions only.

Logits come from hidden rows [block_start - shift, block_start - shift + 32): for Dream the head at
position i predicts token i + 1, so the block's first token is read from the hidden state of the token
to its left. A Dream decode therefore widens its query by that one token (33 rows). That token attends
to the cache like the others, but its K/V are not written back (they go to the cache's scratch page):
outside the block, the dual cache keeps the values of the last prefill, exactly as Fast-dLLM's
`replace_position` does. This is exact, unlike reusing the first block position's own logit.

A prefill's queries attend to exactly the K/V rows of its own span, so the prefills that end the
microbatch (`ModelRunner` packs decodes first, as the engine does) form a `PrefillTail` that can attend
over those rows directly (`executor.model.prefill_attention`) while the items before it attend over their
pages.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

import torch
from torch import Tensor

from executor.model.attention import AttentionLayout
from executor.model.kv_cache import KVSlots
from sangam.hardware import BLOCK


class Phase(StrEnum):
    PREFILL = "prefill"
    DECODE = "decode"


@dataclass(frozen=True, slots=True)
class ForwardItem:
    """One request's share of a microbatch: its whole current sequence and the block being denoised."""

    request_id: int
    phase: Phase
    tokens: Tensor  # (S,) int64 ids: prompt, committed blocks, masks
    block_start: int

    def __post_init__(self) -> None:
        if not 0 <= self.block_start <= self.seq_len - BLOCK:
            raise ValueError(f"request {self.request_id}: block at {self.block_start} outside {self.seq_len}")

    @property
    def seq_len(self) -> int:
        return len(self.tokens)


@dataclass(frozen=True, slots=True)
class PrefillTail:
    """The microbatch's trailing prefills: `items` of them, from packed row `start` on, sequence i owning
    rows `start + indptr[i]:start + indptr[i + 1]` (host int32 CSR offsets)."""

    items: int
    start: int
    indptr: Tensor


@dataclass(frozen=True, slots=True)
class MicrobatchPlan:
    """Everything one forward needs; tensors on the model's device, the attention layout on the host."""

    tokens: Tensor  # (T,) packed query tokens
    positions: Tensor  # (T,) their absolute positions (RoPE)
    layout: AttentionLayout
    slots: KVSlots  # (T,) where each row's K/V are stored: the scratch page for rows not kept
    head_rows: Tensor  # (items * BLOCK,) packed rows the LM head reads
    prefill_tail: PrefillTail | None = None  # None: the last item is a decode


@dataclass(frozen=True, slots=True)
class _Span:
    query: range
    written: range
    head: range


def _span(item: ForwardItem, shift: int) -> _Span:
    if item.block_start < shift:
        raise ValueError(f"request {item.request_id}: a shifted head needs a token left of the block")
    head_start = item.block_start - shift
    block = range(item.block_start, item.block_start + BLOCK)
    if item.phase is Phase.PREFILL:
        whole = range(item.seq_len)
        return _Span(whole, whole, range(head_start, head_start + BLOCK))
    return _Span(range(head_start, block.stop), block, range(head_start, head_start + BLOCK))


def plan_microbatch(
    items: Sequence[ForwardItem],
    page_tables: Sequence[Sequence[int]],
    shift: int,
    scratch_page: int,
    device: torch.device,
) -> MicrobatchPlan:
    """Pack `items` (each with its request's page table) into one forward's plan, in item order.

    Rows whose K/V are not kept are stored at offset 0 of `scratch_page`, a page no item attends to.
    """
    if not items:
        raise ValueError("an empty microbatch has nothing to run")
    spans = [_span(item, shift) for item in items]
    layout = AttentionLayout.build([len(s.query) for s in spans], [i.seq_len for i in items], page_tables)
    tokens, positions, head_rows, pages, offsets = [], [], [], [], []
    row = 0
    for item, span, table in zip(items, spans, page_tables, strict=True):
        kept = span.written.start - span.query.start  # rows before the written span are not kept
        slots = KVSlots.of(table, torch.arange(span.written.start, span.written.stop))
        tokens.append(item.tokens[span.query.start : span.query.stop])
        positions.append(torch.arange(span.query.start, span.query.stop))
        head_rows.append(row + torch.arange(span.head.start, span.head.stop) - span.query.start)
        pages.append(torch.cat([torch.full((kept,), scratch_page), slots.pages]))
        offsets.append(torch.cat([torch.zeros(kept, dtype=torch.long), slots.offsets]))
        row += len(span.query)
    return MicrobatchPlan(
        tokens=torch.cat(tokens).to(device),
        positions=torch.cat(positions).to(device),
        layout=layout,
        slots=KVSlots(torch.cat(pages).to(device), torch.cat(offsets).to(device)),
        head_rows=torch.cat(head_rows).to(device),
        prefill_tail=prefill_tail(items, layout.qo_indptr),
    )


def prefill_tail(items: Sequence[ForwardItem], qo_indptr: Tensor) -> PrefillTail | None:
    """The trailing run of prefills among `items` (packed with these row offsets), or None."""
    count = 0
    while count < len(items) and items[len(items) - 1 - count].phase is Phase.PREFILL:
        count += 1
    if count == 0:
        return None
    first = len(items) - count
    start = int(qo_indptr[first])
    return PrefillTail(count, start, qo_indptr[first:] - start)
