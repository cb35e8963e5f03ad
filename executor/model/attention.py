"""Attention backends: non-causal attention of one microbatch's ragged queries over the paged KV cache.

A backend is planned once per microbatch with an `AttentionLayout` and then run once per layer, the
same plan/run split as FlashInfer's `BatchPrefillWithPagedKVCacheWrapper`. The layout already holds
that wrapper's CSR arguments (`qo_indptr`, `paged_kv_indptr`, `paged_kv_indices`,
`paged_kv_last_page_len`), so a FlashInfer backend built with `causal=False` and the model's head
counts can replace `TorchAttention` without touching any caller.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from executor.model.kv_cache import gather_kv
from sangam.hardware import PAGE, pages_for


@dataclass(frozen=True, slots=True)
class AttentionLayout:
    """Ragged queries over paged KV in CSR form, as int32 host tensors.

    Item i owns packed query rows `qo_indptr[i]:qo_indptr[i + 1]` and attends to every one of its first
    `kv_lens[i]` positions, stored in pages `kv_indices[kv_indptr[i]:kv_indptr[i + 1]]`, the last of them
    filled to `kv_last_page_len[i]`.
    """

    qo_indptr: Tensor
    kv_indptr: Tensor
    kv_indices: Tensor
    kv_last_page_len: Tensor

    @staticmethod
    def build(
        query_lens: Sequence[int], kv_lens: Sequence[int], page_tables: Sequence[Sequence[int]]
    ) -> AttentionLayout:
        """The layout of items with these query counts, KV lengths and page tables (position order)."""
        used = [list(table[: pages_for(kv_len)]) for table, kv_len in zip(page_tables, kv_lens, strict=True)]
        if any(len(pages) < pages_for(kv_len) for pages, kv_len in zip(used, kv_lens, strict=True)):
            raise ValueError("a page table holds fewer pages than its KV length needs")
        return AttentionLayout(
            qo_indptr=indptr(query_lens),
            kv_indptr=indptr([len(pages) for pages in used]),
            kv_indices=torch.tensor([p for pages in used for p in pages], dtype=torch.int32),
            kv_last_page_len=torch.tensor(
                [n - (pages_for(n) - 1) * PAGE for n in kv_lens], dtype=torch.int32
            ),
        )

    def head(self, items: int) -> AttentionLayout:
        """The layout of the first `items` items alone (their packed rows come first)."""
        pages = int(self.kv_indptr[items])
        return AttentionLayout(
            self.qo_indptr[: items + 1], self.kv_indptr[: items + 1], self.kv_indices[:pages],
            self.kv_last_page_len[:items],
        )  # fmt: skip

    @property
    def num_items(self) -> int:
        return len(self.kv_last_page_len)

    @property
    def kv_lens(self) -> list[int]:
        return self.kv_len_tensor().tolist()

    def kv_len_tensor(self) -> Tensor:
        """Each item's KV length, int32 on the host."""
        return (self.kv_indptr[1:] - self.kv_indptr[:-1] - 1) * PAGE + self.kv_last_page_len


def same_layout(a: AttentionLayout, b: AttentionLayout) -> bool:
    """Whether two layouts hold the same CSR arrays (then one plan serves both)."""
    return a is b or all(
        torch.equal(x, y)
        for x, y in (
            (a.qo_indptr, b.qo_indptr),
            (a.kv_indptr, b.kv_indptr),
            (a.kv_indices, b.kv_indices),
            (a.kv_last_page_len, b.kv_last_page_len),
        )
    )


def indptr(lengths: Sequence[int]) -> Tensor:
    """CSR offsets (int32, on the host) of consecutive runs of these lengths."""
    indptr = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    indptr[1:] = torch.tensor(lengths, dtype=torch.int32).cumsum(0)
    return indptr


class AttentionBackend(Protocol):
    """Plans a microbatch once, then runs every layer's attention under that plan."""

    def plan(self, layout: AttentionLayout) -> None:
        """Prepare for the layers of one forward; called before the first layer."""

    def run(self, q: Tensor, kv_layer: Tensor) -> Tensor:
        """Packed q (T, heads, head_dim) over one layer's page tensor -> (T, heads, head_dim), non-causal."""
        ...


@dataclass(frozen=True, slots=True)
class _Item:
    rows: slice
    pages: Tensor
    kv_len: int


class TorchAttention:
    """The reference backend: one SDPA call per item over K/V gathered from its pages (CPU and checks)."""

    def __init__(self) -> None:
        self._items: list[_Item] = []

    def plan(self, layout: AttentionLayout) -> None:
        qo, kv = layout.qo_indptr.tolist(), layout.kv_indptr.tolist()
        self._items = [
            _Item(slice(qo[i], qo[i + 1]), layout.kv_indices[kv[i] : kv[i + 1]].long(), kv_len)
            for i, kv_len in enumerate(layout.kv_lens)
        ]

    def run(self, q: Tensor, kv_layer: Tensor) -> Tensor:
        out = torch.empty_like(q)
        for item in self._items:
            k, v = gather_kv(kv_layer, item.pages.to(kv_layer.device), item.kv_len)
            # (1, heads, rows, head_dim): with a batch dimension CPU SDPA takes its flash kernel; without one
            # it materialises every score (7-10 times slower on a 1.8k-token tiny-model prefill)
            attended = F.scaled_dot_product_attention(
                q[item.rows].transpose(0, 1)[None],
                k.transpose(0, 1).to(q.dtype)[None],
                v.transpose(0, 1).to(q.dtype)[None],
                is_causal=False,
                enable_gqa=True,
            )
            out[item.rows] = attended[0].transpose(0, 1)
        return out
