"""Decode attention over FP8 pages: a Triton kernel that reads the pages at their byte rate.

FlashInfer's fa2 widens each FP8 element inside its inner loop and reads FP8 pages at about a third of
its bf16 rate, so over FP8 pages a decode's attention was 1.5x slower than over bf16 pages, though it reads
half the bytes (docs/executor-performance.md). A decode item is one block of 32 (Dream: 33) query rows over
its cached KV, so its attention is bound by the KV read. `_attend` runs one program per item, KV head and
KV split: it holds the item's query rows of every query head of that KV head (fp16, as fa2 reads them over
FP8 pages), streams the KV head's pages once, widens K and V to fp16 (one Hopper instruction per pair) and
multiplies on the tensor cores with an online softmax. Where items x KV heads leave the GPU short of
programs, each item's KV is split and `_merge` combines the splits' partial outputs by their log-sum-exp.

`Fp8PageAttention` is an `AttentionBackend` for the decode graphs (`executor.model.cuda_graphs`): its CSR
arrays live in fixed device buffers, its launch shape depends on the bucket's item count only, and `plan`
copies a layout into those buffers. Imported only where Triton is installed.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from executor.model.attention import AttentionLayout, same_layout
from executor.model.fp8 import FP8
from executor.model.fp8_kernels import Launcher
from sangam.hardware import PAGE

STAGES = 3  # software-pipelined KV loads in flight
PROGRAMS_PER_SM = 1  # split KV until the grid holds this many programs per multiprocessor
MIN_BLOCK_M = 64  # packed query rows a program holds, at least


@triton.jit
def _attend(  # type: ignore[no-untyped-def]  # a Triton kernel: its annotations mean other things
    q_ptr,
    kv_ptr,
    out_ptr,
    part_ptr,
    lse_ptr,
    qo_indptr,
    kv_indptr,
    kv_indices,
    kv_lens,
    q_stride_t,
    q_stride_h,
    total_rows,
    scale_log2,
    HEADS: tl.constexpr,
    KV_HEADS: tl.constexpr,
    D: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    M_TILES: tl.constexpr,
    BLOCK: tl.constexpr,
    SPLITS: tl.constexpr,
    HEADS_FIRST: tl.constexpr,
):
    # HEADS_FIRST: programs launched next to each other take the KV heads of one item (they read
    # neighbouring bytes of the same pages), else one KV head of neighbouring items
    tile = tl.program_id(0) if HEADS_FIRST else tl.program_id(1)
    item = tl.program_id(1) if HEADS_FIRST else tl.program_id(0)
    kv_head = tile // M_TILES
    split = tl.program_id(2)
    q_start = tl.load(qo_indptr + item)
    q_len = tl.load(qo_indptr + item + 1) - q_start
    kv_len = tl.load(kv_lens + item)
    first_page = tl.load(kv_indptr + item)
    # packed rows: query head (of this KV head's group) major, the item's query row minor
    m = (tile % M_TILES) * BLOCK_M + tl.arange(0, BLOCK_M)
    head = kv_head * (HEADS // KV_HEADS) + m // ROWS
    row = m % ROWS
    live = (m < (HEADS // KV_HEADS) * ROWS) & (row < q_len)
    token = (q_start + row).to(tl.int64)
    d = tl.arange(0, D)
    q = tl.load(
        q_ptr + token[:, None] * q_stride_t + head[:, None] * q_stride_h + d[None, :],
        mask=live[:, None],
        other=0.0,
    ).to(tl.float16)

    per_split = tl.cdiv(tl.cdiv(kv_len, BLOCK), SPLITS) * BLOCK
    lo = split * per_split
    hi = tl.minimum(lo + per_split, kv_len)
    best = tl.full([BLOCK_M], float("-inf"), tl.float32)
    total = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    n = tl.arange(0, BLOCK)
    TOKEN: tl.constexpr = KV_HEADS * D  # elements between positions of a page
    KIND: tl.constexpr = PAGE_SIZE * TOKEN  # between a page's K and its V
    for start in range(lo, hi, BLOCK):
        position = start + n
        inside = position < hi
        page = tl.load(kv_indices + first_page + position // PAGE_SIZE, mask=inside, other=0).to(tl.int64)
        at = page * (2 * KIND) + (position % PAGE_SIZE) * TOKEN + kv_head * D
        k = tl.load(kv_ptr + at[:, None] + d[None, :], mask=inside[:, None], other=0.0).to(tl.float16)
        score = tl.dot(q, tl.trans(k)) * scale_log2
        score = tl.where(inside[None, :], score, float("-inf"))
        top = tl.maximum(best, tl.max(score, 1))
        weight = tl.exp2(score - top[:, None])
        rescale = tl.exp2(best - top)
        total = total * rescale + tl.sum(weight, 1)
        v = tl.load(kv_ptr + KIND + at[:, None] + d[None, :], mask=inside[:, None], other=0.0).to(tl.float16)
        acc = acc * rescale[:, None] + tl.dot(weight.to(tl.float16), v)
        best = top

    out = acc / tl.where(total > 0, total, 1.0)[:, None]  # an empty split has no weight
    if SPLITS == 1:
        at = (token * HEADS + head)[:, None] * D + d[None, :]
        tl.store(out_ptr + at, out.to(out_ptr.dtype.element_ty), mask=live[:, None])
    else:
        slot = (split * total_rows + token) * HEADS + head
        tl.store(part_ptr + slot[:, None] * D + d[None, :], out, mask=live[:, None])
        tl.store(lse_ptr + slot, best + tl.log2(total), mask=live)  # -inf for an empty split


@triton.jit
def _merge(  # type: ignore[no-untyped-def]
    part_ptr, lse_ptr, out_ptr, rows_heads, D: tl.constexpr, SPLITS: tl.constexpr
):
    slot = tl.program_id(0).to(tl.int64)
    s = tl.arange(0, SPLITS)
    d = tl.arange(0, D)
    lse = tl.load(lse_ptr + s * rows_heads + slot)
    top = tl.max(lse, 0)
    weight = tl.exp2(lse - top)  # every row's item has KV, so some split holds a finite lse
    part = tl.load(part_ptr + (s * rows_heads + slot)[:, None] * D + d[None, :])
    out = tl.sum(part * weight[:, None], 0) / tl.sum(weight, 0)
    tl.store(out_ptr + slot * D + d, out.to(out_ptr.dtype.element_ty))


_ATTEND = Launcher(_attend)
_MERGE = Launcher(_merge)


def kv_splits(items: int, kv_heads: int, multiprocessors: int) -> int:
    """KV splits per item (a power of two, at most 16) that give the grid `PROGRAMS_PER_SM` programs per
    multiprocessor."""
    want = PROGRAMS_PER_SM * multiprocessors / (items * kv_heads)
    return min(16, 1 << max(0, math.ceil(math.log2(want)))) if want > 1 else 1


class Fp8PageAttention:
    """Non-causal attention of `items` decode items of at most `rows` query rows each over FP8 pages.

    The `AttentionBackend` of one decode-graph bucket: `plan(layout)` copies a layout of exactly `items`
    items (padding items included; plan entries without rows are allowed) into fixed device buffers, and
    `run(q, kv_layer)`, with q `(items * rows, heads, head_dim)` in fp16/bf16, launches a grid that depends
    on `items` only, so it can be captured in a CUDA graph.
    """

    def __init__(
        self,
        heads: int,
        kv_heads: int,
        head_dim: int,
        *,
        items: int,
        rows: int,
        max_pages: int,
        device: torch.device | str,
        multiprocessors: int,
        splits: int | None = None,
    ) -> None:
        if heads % kv_heads or head_dim & (head_dim - 1):
            raise ValueError(f"heads {heads} need a multiple of kv_heads {kv_heads}, head_dim a power of 2")
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.items, self.rows = items, rows
        packed = heads // kv_heads * rows
        # at least 64 rows, padded: Triton then multiplies on Hopper's warpgroup MMA, LLaDA's 32 rows a head
        # 10% faster with no other change (`benchmarks/kv_attention_speed.py`, docs/executor-performance.md)
        self.block_m = min(128, max(MIN_BLOCK_M, triton.next_power_of_2(packed)))
        self.m_tiles = -(-packed // self.block_m)
        self.splits = splits or kv_splits(items, kv_heads * self.m_tiles, multiprocessors)
        if self.splits & (self.splits - 1) or not 1 <= self.splits <= 16:
            raise ValueError(f"splits must be a power of 2 from 1 to 16, not {self.splits}")
        # the fastest on an H200 (`benchmarks/kv_attention_speed.py --page-sweep` sweeps these): 128 KV
        # positions a step for one query head's 32 rows (LLaDA), 64 for a GQA group's 231 (Dream)
        self.block_n, self.warps, self.stages = (128 if packed <= 64 else 64), 4, STAGES
        self.heads_first = False  # the grid's order (`_attend`); the sweep times both
        device = torch.device(device)

        def int32(length: int) -> Tensor:
            return torch.zeros(length, dtype=torch.int32, device=device)

        self.qo_indptr, self.kv_indptr = int32(items + 1), int32(items + 1)
        self.kv_indices, self.kv_lens = int32(max_pages), int32(items)
        total = items * rows * heads
        self.partial = torch.empty((self.splits * total, head_dim), dtype=torch.float32, device=device)
        self.lse = torch.empty(self.splits * total, dtype=torch.float32, device=device)
        self._planned: AttentionLayout | None = None
        self._rows = 0  # query rows the planned layout reads

    def plan(self, layout: AttentionLayout) -> None:
        if self._planned is not None and same_layout(self._planned, layout):
            return
        if layout.num_items != self.items or len(layout.kv_indices) > len(self.kv_indices):
            raise ValueError(
                f"a layout of {layout.num_items} items and {len(layout.kv_indices)} pages does not fit "
                f"{self.items} items and {len(self.kv_indices)} pages"
            )
        query_lens, kv_lens = layout.qo_indptr[1:] - layout.qo_indptr[:-1], layout.kv_len_tensor()
        if int(query_lens.max()) > self.rows:
            raise ValueError(f"an item has more than {self.rows} query rows")
        if bool(((query_lens > 0) & (kv_lens < 1)).any()):  # its splits would merge to 0 / 0
            raise ValueError("an item with query rows attends to no KV")
        self.qo_indptr.copy_(layout.qo_indptr, non_blocking=True)
        self.kv_indptr.copy_(layout.kv_indptr, non_blocking=True)
        self.kv_indices[: len(layout.kv_indices)].copy_(layout.kv_indices, non_blocking=True)
        self.kv_lens.copy_(kv_lens, non_blocking=True)
        self._planned = layout
        self._rows = int(layout.qo_indptr[-1])

    def run(self, q: Tensor, kv_layer: Tensor) -> Tensor:
        if kv_layer.dtype != FP8 or not kv_layer.is_contiguous() or q.stride(2) != 1:
            raise ValueError("Fp8PageAttention reads contiguous FP8 pages and head-contiguous queries")
        rows = q.shape[0]
        if not self._rows <= rows <= self.items * self.rows:
            raise ValueError(f"{rows} query rows, not {self._rows} to {self.items} items of {self.rows}")
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        tiles = self.kv_heads * self.m_tiles
        _ATTEND(
            (tiles, self.items, self.splits) if self.heads_first else (self.items, tiles, self.splits),
            q,
            kv_layer,
            out,
            self.partial,
            self.lse,
            self.qo_indptr,
            self.kv_indptr,
            self.kv_indices,
            self.kv_lens,
            q.stride(0),
            q.stride(1),
            rows,
            self.head_dim**-0.5 * math.log2(math.e),
            num_warps=self.warps,
            num_stages=self.stages,
            HEADS=self.heads,
            KV_HEADS=self.kv_heads,
            D=self.head_dim,
            PAGE_SIZE=PAGE,
            ROWS=self.rows,
            BLOCK_M=self.block_m,
            M_TILES=self.m_tiles,
            BLOCK=self.block_n,
            SPLITS=self.splits,
            HEADS_FIRST=self.heads_first,
        )
        if self.splits > 1:
            _MERGE(
                (rows * self.heads,),
                self.partial,
                self.lse,
                out,
                rows * self.heads,
                num_warps=1,
                D=self.head_dim,
                SPLITS=self.splits,
            )
        return out
