"""Triton kernels for `executor.model.fp8` and FP8 KV pages (imported only where Triton is installed: on
CPU the torch code of `fp8` and `executor.model.forward` serves).

One program per row: it loads the whole row into registers (fp32), takes its largest magnitude, and
writes the E4M3 values and the row's fp32 scale, max(amax / 448, MIN_SCALE): one read of the
activations and one write of half their bytes, instead of torch's five elementwise and reduction kernels.
`silu_mul_quantize_rows` also forms silu(gate) * up from the gate/up GEMM's output on the way, and
`add_rmsnorm_quantize_rows` the residual add and RMSNorm before it. `store_kv` writes a forward's K and V
rows into FP8 pages in one launch. An eager FP8 forward is bound by the host's launches (issue 30), so
each fusion here is one launch, and its Python, fewer per layer.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from executor.model.fp8 import FP8, FP8_MAX, MIN_SCALE


@triton.jit
def _quantize_rows(  # type: ignore[no-untyped-def]  # a Triton kernel: its annotations mean other things
    x_ptr, q_ptr, scale_ptr, width, x_stride, q_stride, fp8_max, min_scale, BLOCK: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    keep = cols < width
    x = tl.load(x_ptr + row * x_stride + cols, mask=keep, other=0.0).to(tl.float32)
    scale = tl.maximum(tl.max(tl.abs(x), axis=0) / fp8_max, min_scale)
    q = tl.clamp(x / scale, -fp8_max, fp8_max)
    tl.store(q_ptr + row * q_stride + cols, q.to(q_ptr.dtype.element_ty), mask=keep)
    tl.store(scale_ptr + row, scale)


@triton.jit
def _silu_mul_quantize_rows(  # type: ignore[no-untyped-def]
    x_ptr, q_ptr, scale_ptr, width, x_stride, q_stride, fp8_max, min_scale, BLOCK: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    keep = cols < width
    gate = tl.load(x_ptr + row * x_stride + cols, mask=keep, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * x_stride + width + cols, mask=keep, other=0.0).to(tl.float32)
    x = gate / (1.0 + tl.exp(-gate)) * up
    scale = tl.maximum(tl.max(tl.abs(x), axis=0) / fp8_max, min_scale)
    q = tl.clamp(x / scale, -fp8_max, fp8_max)
    tl.store(q_ptr + row * q_stride + cols, q.to(q_ptr.dtype.element_ty), mask=keep)
    tl.store(scale_ptr + row, scale)


@triton.jit
def _add_rmsnorm_quantize_rows(  # type: ignore[no-untyped-def]
    x_ptr,
    h_ptr,
    w_ptr,
    q_ptr,
    scale_ptr,
    width,
    x_stride,
    h_stride,
    q_stride,
    eps,
    fp8_max,
    min_scale,
    ADD: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    keep = cols < width
    h = tl.load(h_ptr + row * h_stride + cols, mask=keep, other=0.0)
    if ADD:  # the stream's sum is rounded to its dtype, as a separate add would round it
        x = tl.load(x_ptr + row * x_stride + cols, mask=keep, other=0.0)
        h = (h.to(tl.float32) + x.to(tl.float32)).to(h_ptr.dtype.element_ty)
        tl.store(h_ptr + row * h_stride + cols, h, mask=keep)
    h = h.to(tl.float32)
    weight = tl.load(w_ptr + cols, mask=keep, other=0.0).to(tl.float32)
    y = h * tl.rsqrt(tl.sum(h * h, axis=0) / width + eps) * weight
    scale = tl.maximum(tl.max(tl.abs(y), axis=0) / fp8_max, min_scale)
    q = tl.clamp(y / scale, -fp8_max, fp8_max)
    tl.store(q_ptr + row * q_stride + cols, q.to(q_ptr.dtype.element_ty), mask=keep)
    tl.store(scale_ptr + row, scale)


@triton.jit
def _store_kv(  # type: ignore[no-untyped-def]
    k_ptr,
    v_ptr,
    kv_ptr,
    rows_ptr,
    width,
    k_stride,
    v_stride,
    fp8_max,
    PAGE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    k_row = tl.load(
        rows_ptr + token
    )  # K's row in the layer seen as (pages * 2 * PAGE, width); V's is PAGE on
    cols = tl.arange(0, BLOCK)
    keep = cols < width
    k = tl.load(k_ptr + token * k_stride + cols, mask=keep, other=0.0).to(tl.float32)
    v = tl.load(v_ptr + token * v_stride + cols, mask=keep, other=0.0).to(tl.float32)
    kind = kv_ptr.dtype.element_ty
    tl.store(kv_ptr + k_row * width + cols, tl.clamp(k, -fp8_max, fp8_max).to(kind), mask=keep)
    tl.store(kv_ptr + (k_row + PAGE) * width + cols, tl.clamp(v, -fp8_max, fp8_max).to(kind), mask=keep)


def _warps(block: int) -> int:
    return max(1, min(16, block // 1024))


def _launch(kernel: object, x: Tensor, width: int) -> tuple[Tensor, Tensor]:
    rows = x.shape[0]
    q = torch.empty((rows, width), dtype=FP8, device=x.device)
    scale = torch.empty((rows, 1), dtype=torch.float32, device=x.device)
    if rows:
        block = triton.next_power_of_2(width)
        kernel[(rows,)](  # type: ignore[index]
            x,
            q,
            scale,
            width,
            x.stride(0),
            q.stride(0),
            FP8_MAX,
            MIN_SCALE,
            BLOCK=block,
            num_warps=_warps(block),
        )
    return q, scale


def quantize_rows(x: Tensor) -> tuple[Tensor, Tensor]:
    """E4M3 values (M, K) and fp32 scales (M, 1) of `x` (M, K), its last dimension contiguous."""
    return _launch(_quantize_rows, x, x.shape[1])


def silu_mul_quantize_rows(gate_up: Tensor) -> tuple[Tensor, Tensor]:
    """silu(gate) * up of `gate_up` (M, 2I), quantized per row: (M, I) E4M3 and (M, 1) fp32."""
    return _launch(_silu_mul_quantize_rows, gate_up, gate_up.shape[1] // 2)


def add_rmsnorm_quantize_rows(
    x: Tensor | None, residual: Tensor, weight: Tensor, eps: float
) -> tuple[Tensor, Tensor]:
    """RMSNorm (fp32, times `weight`) of residual + x (M, K), quantized per row: (M, K) E4M3 and (M, 1) fp32.
    The sum is written into `residual` in place; x None: the norm of `residual` as it is."""
    rows, width = residual.shape
    q = torch.empty((rows, width), dtype=FP8, device=residual.device)
    scale = torch.empty((rows, 1), dtype=torch.float32, device=residual.device)
    if rows:
        block = triton.next_power_of_2(width)
        source = residual if x is None else x
        _add_rmsnorm_quantize_rows[(rows,)](
            source,
            residual,
            weight,
            q,
            scale,
            width,
            source.stride(0),
            residual.stride(0),
            q.stride(0),
            eps,
            FP8_MAX,
            MIN_SCALE,
            ADD=x is not None,
            BLOCK=block,
            num_warps=_warps(block),
        )
    return q, scale


def store_kv(kv_layer: Tensor, k_rows: Tensor, k: Tensor, v: Tensor, page: int) -> None:
    """Cast K and V (T, kv_heads, head_dim), each head's row contiguous, into the E4M3 `kv_layer` (pages, 2,
    page, kv_heads, head_dim), saturating at +-448: token t's K at row k_rows[t] of the layer seen as
    (pages * 2 * page, kv_heads * head_dim), its V `page` rows on."""
    width = k.shape[1] * k.shape[2]
    if len(k):
        block = triton.next_power_of_2(width)
        _store_kv[(len(k),)](
            k,
            v,
            kv_layer,
            k_rows,
            width,
            k.stride(0),
            v.stride(0),
            FP8_MAX,
            PAGE=page,
            BLOCK=block,
            num_warps=_warps(block),
        )
