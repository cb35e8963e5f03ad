"""The paged KV cache: one `(num_pages, 2, PAGE, kv_heads, head_dim)` tensor per layer.

Page accounting is sangam's: the worker's `sangam.kv.PagePool` (the same one its batcher allocates
from) decides which request holds which page ids, and this cache only stores K/V at those ids. The
layout is FlashInfer's paged NHD layout, with K stored after RoPE, so a FlashInfer backend can read
these tensors as they are. One more page than the pool holds, `scratch_page`, takes the K/V of query
rows that a forward computes but must not keep (a Dream decode's row left of its block), so every
forward stores all its rows in one pass.

With `--kv-cache-dtype fp8` the pages hold E4M3 (`kv_dtype`): half the bytes of bf16, so the same memory
holds twice the pages. K and V are stored with a per-tensor scale of 1.0, vLLM's default for an FP8 KV
cache without calibrated scales: a write saturates at +-448 (on a GPU, `fp8_kernels.store_kv` clamps
before its cast; elsewhere torch 2.13's cast, which saturates on the host: the device's torch 2.11 cast
turned 470 into NaN on an H200), a read is a plain cast back to the compute dtype (`TorchAttention`), and
FlashInfer runs with its default scales (1.0). Calibrated scales are not implemented.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from executor.model.config import ModelConfig
from executor.model.fp8 import FP8
from sangam.hardware import PAGE
from sangam.kv import PagePool

KV_DTYPES = {"fp8": FP8}  # `--kv-cache-dtype` values besides auto (the model's dtype)


def kv_dtype(kv_cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """The torch dtype the pages store for `--kv-cache-dtype` (auto: the model's own)."""
    return model_dtype if kv_cache_dtype == "auto" else KV_DTYPES[kv_cache_dtype]


def as_bits(kv: Tensor) -> Tensor:
    """`kv` as it is copied and moved: FP8 seen as bytes (torch has no CPU `index_copy_` for it, and NCCL
    moves it as uint8 either way); other dtypes as they are (NCCL has no 16-bit integer type, so bf16
    must travel as bf16)."""
    return kv.view(torch.uint8) if kv.element_size() == 1 else kv


@dataclass(frozen=True, slots=True)
class KVSlots:
    """Where written K/V rows land: a page id and an offset inside that page per row."""

    pages: Tensor  # (rows,) int64
    offsets: Tensor  # (rows,) int64

    @staticmethod
    def of(page_table: Sequence[int], positions: Tensor) -> KVSlots:
        """Slots of absolute `positions` (rows,) of a request holding `page_table`, on positions' device."""
        table = torch.as_tensor(page_table, dtype=torch.long, device=positions.device)
        return KVSlots(table[positions // PAGE], positions % PAGE)


def gather_kv(kv_layer: Tensor, pages: Tensor, kv_len: int) -> tuple[Tensor, Tensor]:
    """K and V, each (kv_len, kv_heads, head_dim), of the first `kv_len` positions stored in `pages`."""
    kv = kv_layer[pages].transpose(0, 1).flatten(1, 2)  # (2, pages * PAGE, kv_heads, head_dim)
    return kv[0, :kv_len], kv[1, :kv_len]


class PagedKVCache:
    """Per-layer paged K/V storage sized to a `PagePool`; page ids index its first dimension."""

    def __init__(
        self,
        pool: PagePool,
        layers: int,
        kv_heads: int,
        head_dim: int,
        *,
        dtype: torch.dtype,
        device: str | torch.device,
    ) -> None:
        self.pool = pool
        self.scratch_page = pool.capacity  # past every id the pool hands out; no attention reads it
        shape = (pool.capacity + 1, 2, PAGE, kv_heads, head_dim)
        self.layers = [torch.empty(shape, dtype=dtype, device=device) for _ in range(layers)]

    @classmethod
    def for_model(
        cls, pool: PagePool, config: ModelConfig, *, dtype: torch.dtype, device: str | torch.device
    ) -> PagedKVCache:
        shape = config.shape
        return cls(pool, shape.layers, shape.kv_heads, shape.head_dim, dtype=dtype, device=device)

    def page_table(self, owner: int) -> list[int]:
        """The page ids `owner` (a request id) holds in the pool, in position order."""
        return self.pool.pages_of(owner)

    def write(self, layer: int, slots: KVSlots, k: Tensor, v: Tensor) -> None:
        """Store K and V rows, each (W, kv_heads, head_dim), at `slots`, overwriting what was there."""
        kv = self.layers[layer]
        kv[slots.pages, 0, slots.offsets] = k.to(kv.dtype)
        kv[slots.pages, 1, slots.offsets] = v.to(kv.dtype)

    def gather(self, layer: int, owner: int, kv_len: int) -> tuple[Tensor, Tensor]:
        """`owner`'s K and V for positions [0, kv_len) of `layer`."""
        pages = torch.as_tensor(self.page_table(owner), dtype=torch.long, device=self.layers[layer].device)
        return gather_kv(self.layers[layer], pages, kv_len)
