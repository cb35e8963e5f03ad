"""Prefill attention over the forward's own K/V rows: a Triton flash-attention kernel (imported only where
Triton is installed).

A prefill's queries attend, non-causally, to exactly the K/V rows of their own sequence
(`executor.model.prefill_attention`). `_prefill` runs one program per tile of `BLOCK_M` query rows of one
sequence and one query head: it holds the tile's queries, streams the sequence's K and V rows of the head's
KV head in `BLOCK_N` steps (unmasked but for the last, partial one), multiplies on the tensor cores in the
activation dtype and keeps an online softmax in fp32. q, k and v may be strided views of one q/k/v
projection, as the model hands them on. `TritonPrefillAttention.plan` lists the tiles once per microbatch,
those of the longest sequences first; the grid runs every tile of one query head before the next head's, so
consecutive programs share their K/V.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from executor.model.fp8_kernels import Launcher
from executor.model.prefill_attention import prefill_tiles
from executor.model.transformer import split_heads


@triton.jit
def _update(acc, best, total, q, k, v, scale_log2, inside, MASKED: tl.constexpr):  # type: ignore[no-untyped-def]
    """One online-softmax step of the tile's rows over one block of K/V rows."""
    score = tl.dot(q, tl.trans(k)) * scale_log2
    if MASKED:
        score = tl.where(inside[None, :], score, float("-inf"))
    top = tl.maximum(best, tl.max(score, 1))
    weight = tl.exp2(score - top[:, None])
    rescale = tl.exp2(best - top)
    total = total * rescale + tl.sum(weight, 1)
    acc = acc * rescale[:, None] + tl.dot(weight.to(v.dtype), v)
    return acc, top, total


@triton.jit
def _prefill(  # type: ignore[no-untyped-def]  # a Triton kernel: its annotations mean other things
    q_ptr,
    k_ptr,
    v_ptr,
    out_ptr,
    tiles_ptr,
    q_stride_t,
    q_stride_h,
    k_stride_t,
    k_stride_h,
    v_stride_t,
    v_stride_h,
    out_stride_t,
    out_stride_h,
    scale_log2,
    GROUP: tl.constexpr,
    D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    tile = tl.program_id(0)
    head = tl.program_id(1)
    kv_head = head // GROUP
    first = tl.load(tiles_ptr + 3 * tile)  # the tile's first row; its sequence's rows are lo .. hi
    lo = tl.load(tiles_ptr + 3 * tile + 1)
    hi = tl.load(tiles_ptr + 3 * tile + 2)
    rows = (first + tl.arange(0, BLOCK_M)).to(tl.int64)
    live = rows < hi
    d = tl.arange(0, D)
    q_at = rows[:, None] * q_stride_t + head * q_stride_h + d[None, :]
    q = tl.load(q_ptr + q_at, mask=live[:, None], other=0.0)

    best = tl.full([BLOCK_M], float("-inf"), tl.float32)
    total = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    n = tl.arange(0, BLOCK_N)
    k_head = k_ptr + kv_head * k_stride_h + d[None, :]
    v_head = v_ptr + kv_head * v_stride_h + d[None, :]
    whole = lo + (hi - lo) // BLOCK_N * BLOCK_N
    for start in range(lo, whole, BLOCK_N):
        at = (start + n).to(tl.int64)[:, None]
        k = tl.load(k_head + at * k_stride_t)
        v = tl.load(v_head + at * v_stride_t)
        acc, best, total = _update(acc, best, total, q, k, v, scale_log2, n, MASKED=False)
    if whole < hi:
        position = whole + n
        inside = position < hi
        at = position.to(tl.int64)[:, None]
        k = tl.load(k_head + at * k_stride_t, mask=inside[:, None], other=0.0)
        v = tl.load(v_head + at * v_stride_t, mask=inside[:, None], other=0.0)
        acc, best, total = _update(acc, best, total, q, k, v, scale_log2, inside, MASKED=True)

    out = acc / total[:, None]  # every row of a sequence sees at least its own K
    at = rows[:, None] * out_stride_t + head * out_stride_h + d[None, :]
    tl.store(out_ptr + at, out.to(out_ptr.dtype.element_ty), mask=live[:, None])


_PREFILL = Launcher(_prefill)
# (BLOCK_M, BLOCK_N, warps, stages): the fastest of six configurations in every shape on an H200 (LLaDA-8B's
# 2,048 rows 152.0 us against fa2's 184.1; `benchmarks/prefill_attention_speed.py --sweep`). It needs about
# 224 KiB of shared memory a program: GPUs with less take FlashInfer or SDPA (`make_prefill_attention`).
DEFAULT_CONFIG = (128, 128, 8, 3)


class TritonPrefillAttention:
    """The `PrefillAttention` of `_prefill`: plan lists the microbatch's tiles, run launches one grid of
    tiles x query heads. `config` is the kernel's launch configuration, (BLOCK_M, BLOCK_N, warps, stages).
    The constructor compiles the kernel for `dtype` over one row of a q/k/v projection, so a worker's first
    prefill does not wait for Triton (and a GPU that cannot run the configuration raises here)."""

    def __init__(
        self,
        heads: int,
        kv_heads: int,
        head_dim: int,
        *,
        device: torch.device | str,
        dtype: torch.dtype = torch.bfloat16,
        config: tuple[int, int, int, int] = DEFAULT_CONFIG,
    ) -> None:
        if heads % kv_heads or head_dim & (head_dim - 1):
            raise ValueError(f"heads {heads} need a multiple of kv_heads {kv_heads}, head_dim a power of 2")
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.device = torch.device(device)
        self.block_m, self.block_n, self.warps, self.stages = config
        qkv = torch.zeros(1, (heads + 2 * kv_heads) * head_dim, dtype=dtype, device=self.device)
        q, k, v = split_heads(qkv, heads, kv_heads, head_dim)
        self.plan(torch.tensor([0, 1], dtype=torch.int32))
        self.run(q, k, v, torch.empty_like(q))

    def plan(self, indptr: Tensor) -> None:
        self._tiles = prefill_tiles(indptr, self.block_m).to(self.device, non_blocking=True)

    def run(self, q: Tensor, k: Tensor, v: Tensor, out: Tensor) -> None:
        if not len(self._tiles):
            return
        if any(t.stride(2) != 1 for t in (q, k, v, out)):
            raise ValueError("prefill attention reads and writes head-contiguous rows")
        heads, kv_heads = (len(q), self.heads, self.head_dim), (len(q), self.kv_heads, self.head_dim)
        if (q.shape, k.shape, v.shape, out.shape) != (heads, kv_heads, kv_heads, heads):  # else reads astray
            raise ValueError(
                f"prefill attention of {self.heads} query and {self.kv_heads} KV heads of {self.head_dim}: "
                f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, out {tuple(out.shape)}"
            )
        _PREFILL(
            (len(self._tiles), self.heads),
            q,
            k,
            v,
            out,
            self._tiles,
            q.stride(0),
            q.stride(1),
            k.stride(0),
            k.stride(1),
            v.stride(0),
            v.stride(1),
            out.stride(0),
            out.stride(1),
            self.head_dim**-0.5 * math.log2(math.e),
            num_warps=self.warps,
            num_stages=self.stages,
            GROUP=self.heads // self.kv_heads,
            D=self.head_dim,
            BLOCK_M=self.block_m,
            BLOCK_N=self.block_n,
        )
