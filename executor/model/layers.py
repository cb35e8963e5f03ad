"""Building blocks shared by both families: RMSNorm, rotate-half RoPE and the fused SwiGLU MLP.

On a CUDA device in fp16/bf16, with FlashInfer installed, RMSNorm (with the residual add before it),
SiLU-and-mul and RoPE run as FlashInfer's fused kernels (one launch each instead of five to ten elementwise
ones; same fp32 arithmetic, rounded to the activation dtype once). Everywhere else, and with
`FUSED_KERNELS = False`, the plain torch code below runs.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from executor.model.fp8 import Fp8Linear, Fp8Rows, add_rmsnorm_quantize_rows, quantize_rows

FUSED_KERNELS = True  # False: the plain torch ops everywhere (benchmarks compare the two)


@functools.cache
def _flashinfer() -> Any:
    try:
        return importlib.import_module("flashinfer")
    except Exception:  # not installed (CPU), or unusable: the torch path serves
        return None


def fused_kernels(x: Tensor) -> Any:
    """The flashinfer module when `x` can take its fused kernels (CUDA, fp16/bf16), else None."""
    if not FUSED_KERNELS or x.device.type != "cuda" or x.dtype not in (torch.float16, torch.bfloat16):
        return None
    return _flashinfer()


class RMSNorm(nn.Module):
    """Weight-only RMSNorm, normalised in fp32 and cast back before the weight (as LLaDA and Qwen2 do)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        fused = fused_kernels(x)
        if fused is not None and x.dim() == 2 and x.is_contiguous() and self.weight.dtype == x.dtype:
            return fused.rmsnorm(x, self.weight, self.eps)
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)

    def add_norm(self, x: Tensor, residual: Tensor) -> tuple[Tensor, Tensor]:
        """(norm(residual + x), residual + x). On CUDA one fused kernel does both, in place in x and residual
        (the sum is rounded to the stream's dtype as a separate add would round it)."""
        fused = fused_kernels(x)
        if (
            fused is not None
            and x.dim() == 2
            and x.is_contiguous()
            and residual.is_contiguous()
            and residual.dtype == x.dtype == self.weight.dtype
        ):
            fused.fused_add_rmsnorm(x, residual, self.weight, self.eps)
            return x, residual
        residual = residual + x
        return self(residual), residual

    def add_norm_quantized(self, x: Tensor | None, residual: Tensor) -> tuple[Fp8Rows, Tensor]:
        """(norm(residual + x) quantized per token for an `Fp8Linear`, residual + x); x None: the norm of
        `residual`. On CUDA one Triton kernel does it all (the sum in place in residual; the norm quantized
        from fp32, unrounded); elsewhere the norm above, then `quantize_rows`."""
        fused = add_rmsnorm_quantize_rows(x, residual, self.weight, self.eps)
        if fused is not None:
            return Fp8Rows(*fused, residual.dtype), residual
        if x is None:
            normed = self(residual)
        else:
            normed, residual = self.add_norm(x, residual)
        return Fp8Rows(*quantize_rows(normed), normed.dtype), residual


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)) with gate and up fused into one GEMM, gate first (either projection may
    be an `Fp8Linear` once the model is quantized)."""

    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_up = nn.Linear(hidden, 2 * intermediate, bias=False)
        self.down: nn.Module = nn.Linear(intermediate, hidden, bias=False)  # or an Fp8Linear

    def forward(self, x: Tensor | Fp8Rows) -> Tensor:
        gate_up = self.gate_up(x)
        if isinstance(self.down, Fp8Linear):  # quantized: SiLU-and-mul runs inside its input's quantization
            return self.down.forward_silu_mul(gate_up)
        fused = fused_kernels(gate_up)
        if fused is not None:
            return self.down(fused.silu_and_mul(gate_up))
        gate, up = gate_up.chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


def rope_tables(positions: Tensor, head_dim: int, theta: float) -> tuple[Tensor, Tensor]:
    """fp32 cos and sin, (T, head_dim), for absolute `positions` (T,) in the rotate-half layout."""
    exponents = torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim
    angles = positions.float()[:, None] * (1.0 / theta**exponents)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate `x` (T, heads, head_dim) in fp32 (LLaDA's `rope_full_precision`), returning x's dtype."""
    x32 = x.float()
    first, second = x32.chunk(2, dim=-1)
    rotated = torch.cat([-second, first], dim=-1)
    return (x32 * cos[:, None] + rotated * sin[:, None]).to(x.dtype)


class Rotary:
    """One forward's RoPE tables, applied to q and k together.

    On CUDA (fp16/bf16, FlashInfer present) q and k are rotated in place by one fused kernel that reads a
    per-forward fp32 `[cos | sin]` table by packed row, built once and shared by every layer; elsewhere
    `apply_rope` returns rotated copies.
    """

    def __init__(self, positions: Tensor, head_dim: int, theta: float) -> None:
        self.cos, self.sin = rope_tables(positions, head_dim, theta)
        self._cos_sin: Tensor | None = None
        self._rows: Tensor | None = None

    def __call__(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """q (T, heads, d) and k (T, kv_heads, d) rotated; possibly the same tensors, modified in place."""
        fused = fused_kernels(q)
        if fused is None or q.stride(-1) != 1 or k.stride(-1) != 1:
            return apply_rope(q, self.cos, self.sin), apply_rope(k, self.cos, self.sin)
        if self._cos_sin is None or self._rows is None:
            half = self.cos.shape[-1] // 2
            self._cos_sin = torch.cat([self.cos[:, :half], self.sin[:, :half]], dim=-1).contiguous()
            self._rows = torch.arange(len(self.cos), dtype=torch.int32, device=self.cos.device)
        fused.apply_rope_with_cos_sin_cache_inplace(
            self._rows, q, k, q.shape[-1], self._cos_sin, is_neox=True
        )
        return q, k
