"""Triton kernels that quantize activations per token for `executor.model.fp8` (imported only where
Triton is installed: on CPU the torch code of `fp8` serves).

One program per row: it loads the whole row into registers (fp32), takes its largest magnitude, and
writes the E4M3 values and the row's fp32 scale, max(amax / 448, MIN_SCALE): one read of the
activations and one write of half their bytes, instead of torch's five elementwise and reduction kernels.
`silu_mul_quantize_rows` also forms silu(gate) * up from the gate/up GEMM's output on the way.
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


def _launch(kernel: object, x: Tensor, width: int) -> tuple[Tensor, Tensor]:
    rows = x.shape[0]
    q = torch.empty((rows, width), dtype=FP8, device=x.device)
    scale = torch.empty((rows, 1), dtype=torch.float32, device=x.device)
    if rows:
        block = triton.next_power_of_2(width)
        warps = max(1, min(16, block // 1024))
        kernel[(rows,)](  # type: ignore[index]
            x, q, scale, width, x.stride(0), q.stride(0), FP8_MAX, MIN_SCALE, BLOCK=block, num_warps=warps
        )
    return q, scale


def quantize_rows(x: Tensor) -> tuple[Tensor, Tensor]:
    """E4M3 values (M, K) and fp32 scales (M, 1) of `x` (M, K), its last dimension contiguous."""
    return _launch(_quantize_rows, x, x.shape[1])


def silu_mul_quantize_rows(gate_up: Tensor) -> tuple[Tensor, Tensor]:
    """silu(gate) * up of `gate_up` (M, 2I), quantized per row: (M, I) E4M3 and (M, 1) fp32."""
    return _launch(_silu_mul_quantize_rows, gate_up, gate_up.shape[1] // 2)
