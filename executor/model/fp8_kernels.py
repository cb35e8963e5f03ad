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

from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor

from executor.model.fp8 import FP8, FP8_MAX, MIN_SCALE


@triton.jit
def _store_quantized_row(  # type: ignore[no-untyped-def]
    x, q_ptr, scale_ptr, row, cols, keep, q_stride, fp8_max, min_scale
):
    """Row `row`'s fp32 values `x` as E4M3 with their scale, max(amax / 448, MIN_SCALE), saturating."""
    scale = tl.maximum(tl.max(tl.abs(x), axis=0) / fp8_max, min_scale)
    q = tl.clamp(x / scale, -fp8_max, fp8_max)
    tl.store(q_ptr + row * q_stride + cols, q.to(q_ptr.dtype.element_ty), mask=keep)
    tl.store(scale_ptr + row, scale)


@triton.jit
def _quantize_rows(  # type: ignore[no-untyped-def]  # a Triton kernel: its annotations mean other things
    x_ptr, q_ptr, scale_ptr, width, x_stride, q_stride, fp8_max, min_scale, BLOCK: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    keep = cols < width
    x = tl.load(x_ptr + row * x_stride + cols, mask=keep, other=0.0).to(tl.float32)
    _store_quantized_row(x, q_ptr, scale_ptr, row, cols, keep, q_stride, fp8_max, min_scale)


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
    _store_quantized_row(x, q_ptr, scale_ptr, row, cols, keep, q_stride, fp8_max, min_scale)


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
    _store_quantized_row(y, q_ptr, scale_ptr, row, cols, keep, q_stride, fp8_max, min_scale)


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
    # K's row in the layer seen as (pages * 2 * PAGE, width); V's is PAGE rows on
    k_row = tl.load(rows_ptr + token)
    cols = tl.arange(0, BLOCK)
    keep = cols < width
    k = tl.load(k_ptr + token * k_stride + cols, mask=keep, other=0.0).to(tl.float32)
    v = tl.load(v_ptr + token * v_stride + cols, mask=keep, other=0.0).to(tl.float32)
    kind = kv_ptr.dtype.element_ty
    tl.store(kv_ptr + k_row * width + cols, tl.clamp(k, -fp8_max, fp8_max).to(kind), mask=keep)
    tl.store(kv_ptr + (k_row + PAGE) * width + cols, tl.clamp(v, -fp8_max, fp8_max).to(kind), mask=keep)


COMPILED_LAUNCH = True  # False: every launch through Triton's own `kernel[grid](...)` (benchmarks compare)
# From Triton 3.3 a compiled kernel takes every argument, constexprs included, as `kernel[grid]` binds them
_COMPILED_TAKES_ALL = tuple(int(part) for part in triton.__version__.split(".")[:2]) >= (3, 3)


class Launcher:
    """Launches one Triton kernel through its compiled handle once a signature has compiled.

    Triton's `kernel[grid](...)` re-derives, at every call, the arguments' binding and specialization key
    and reads its knobs from the environment. Launching through the compiled handles instead took an eager
    FP8 forward's host time from 18-19 to 15-16 ms on the H200 machine (Triton 3.6;
    `benchmarks/launch_cost.py --triton-launch` against without). The first launch of a signature goes
    through Triton (compiling it); later ones through `CompiledKernel[grid]`, keyed by what Triton
    specializes on: each tensor's dtype and 16-byte alignment, each integer's being 1, a multiple of 16 or
    outside int32, None, a bool's value, plus `num_warps`, `num_stages` (Triton's default 3) and the
    constexprs. Call it with the kernel's
    non-constexpr arguments positionally and its constexprs by keyword, in signature order; a kernel's
    handle is loaded on the device current at its first launch (one device per worker process).
    """

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel
        self.compiled: dict[tuple[object, ...], Any] = {}

    def __call__(
        self, grid: tuple[int, ...], *args: object, num_warps: int, num_stages: int = 3, **constexprs: object
    ) -> None:
        key = (*map(_specialization, args), num_warps, num_stages, *constexprs.values())
        compiled = self.compiled.get(key) if COMPILED_LAUNCH and _COMPILED_TAKES_ALL else None
        if compiled is None:
            self.compiled[key] = self.kernel[grid](
                *args, **constexprs, num_warps=num_warps, num_stages=num_stages
            )
        else:
            compiled[(*grid, 1, 1)[:3]](*args, *constexprs.values())


def _specialization(arg: object) -> tuple[object, ...]:
    if isinstance(arg, Tensor):
        return "tensor", arg.dtype, arg.data_ptr() % 16 == 0
    if arg is None or isinstance(arg, bool):
        return "constant", arg
    if isinstance(arg, int):
        return "int", arg == 1, arg % 16 == 0, -(2**31) <= arg < 2**31
    return ("float",)  # not specialized


_QUANTIZE_ROWS = Launcher(_quantize_rows)
_SILU_MUL_QUANTIZE_ROWS = Launcher(_silu_mul_quantize_rows)
_ADD_RMSNORM_QUANTIZE_ROWS = Launcher(_add_rmsnorm_quantize_rows)
_STORE_KV = Launcher(_store_kv)


def _warps(block: int) -> int:
    return max(1, min(16, block // 1024))


def _launch(kernel: Launcher, x: Tensor, width: int) -> tuple[Tensor, Tensor]:
    rows = x.shape[0]
    q = torch.empty((rows, width), dtype=FP8, device=x.device)
    scale = torch.empty((rows, 1), dtype=torch.float32, device=x.device)
    if rows:
        block = triton.next_power_of_2(width)
        kernel(
            (rows,),
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
    return _launch(_QUANTIZE_ROWS, x, x.shape[1])


def silu_mul_quantize_rows(gate_up: Tensor) -> tuple[Tensor, Tensor]:
    """silu(gate) * up of `gate_up` (M, 2I), quantized per row: (M, I) E4M3 and (M, 1) fp32."""
    return _launch(_SILU_MUL_QUANTIZE_ROWS, gate_up, gate_up.shape[1] // 2)


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
        _ADD_RMSNORM_QUANTIZE_ROWS(
            (rows,),
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
    (pages * 2 * page, kv_heads * head_dim) (`k_rows` int64: a layer may pass 2**31 elements), its V `page`
    rows on."""
    width = k.shape[1] * k.shape[2]
    if len(k):
        block = triton.next_power_of_2(width)
        _STORE_KV(
            (len(k),),
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
