"""FP8 (E4M3) linear layers: `--quantization fp8`, vLLM's dynamic FP8 scheme.

Weights are quantized once, at load, with one scale per output channel; activations are quantized at
every call with one scale per token (row). A value x of a row (or channel) whose largest magnitude is
amax is stored as round(x / s) in E4M3 with s = max(amax / 448, MIN_SCALE), clamped to +-448 (E4M3's
largest finite value: torch's cast gives NaN beyond it), and the product is

    y[m, n] = s_x[m] * s_w[n] * sum_k q_x[m, k] * q_w[n, k]  (+ bias[n], in the activation dtype)

On a CUDA device in bf16 the sum runs in Hopper's FP8 tensor cores through `torch._scaled_mm` (row-wise
scales, fast accumulation, bf16 out), and one Triton kernel per call quantizes the rows
(`executor.model.fp8_kernels`): for the MLP's down projection fused with SiLU-and-mul, for the q/k/v and
gate/up projections fused with the residual add and RMSNorm before them (`add_rmsnorm_quantize_rows`, whose
`Fp8Rows` the layer takes as they are). Everywhere else (CPU, fp32 tests)
the same quantized values are dequantized and multiplied in the activation dtype: a reference path,
the same function up to the GEMM's summation order.

E4M3 keeps 3 mantissa bits: a normal value round-trips within 2**-4 of itself (relative), and values
under 2**-6 * s (E4M3's subnormals) within 2**-10 * s (absolute).
"""

from __future__ import annotations

import functools
import importlib
import logging
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

log = logging.getLogger("sangam.fp8")

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # E4M3's largest finite value
MIN_SCALE = 1.0 / (FP8_MAX * 512.0)  # vLLM's floor: an all-zero row (graph padding) gets a finite scale
QUANTIZATIONS = ("fp8",)  # `--quantization` values besides none
# Fast FP8 accumulation (no periodic promotion to fp32 inside the GEMM's K loop), as vLLM's FP8 GEMMs run on
# Hopper: graphed decodes and prefills 1.6-17% faster on an H200, the logits' error against bf16 as it was
# (LLaDA 0.333 against 0.331, docs/executor-performance.md). Benchmarks compare (`--exact-accum`).
FAST_ACCUM = True
# False: torch ops on CUDA too, for the activations' quantization, the norm before it and the FP8 K/V store
# (benchmarks compare)
TRITON_KERNELS = True


@dataclass(frozen=True, slots=True)
class Fp8Rows:
    """Activations already quantized per token for an `Fp8Linear`: E4M3 values (M, K), fp32 scales (M, 1),
    and the dtype the product comes back in."""

    values: Tensor
    scale: Tensor
    dtype: torch.dtype


def scales(x: Tensor) -> Tensor:
    """fp32 scales (rows, 1) of the rows of `x` (rows, K): their largest magnitude / 448, at least
    MIN_SCALE."""
    amax = x.abs().amax(dim=-1, keepdim=True).float()
    return (amax / FP8_MAX).clamp_min(MIN_SCALE)


def to_fp8(x: Tensor, scale: Tensor) -> Tensor:
    """round(x / scale) in E4M3, saturated at +-448 (`scale` broadcasts against `x`)."""
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)


def quantize_rows(x: Tensor) -> tuple[Tensor, Tensor]:
    """Per-token quantization of `x` (M, K): E4M3 values (M, K) and fp32 scales (M, 1)."""
    kernels = _kernels(x)
    if kernels is not None:
        return kernels.quantize_rows(x)
    scale = scales(x)
    return to_fp8(x, scale), scale


def silu_mul_quantize_rows(gate_up: Tensor) -> tuple[Tensor, Tensor]:
    """silu(gate) * up of `gate_up` (M, 2I) (gate first), quantized per token: (M, I) E4M3 and (M, 1) fp32.

    The Triton kernel keeps the product in fp32 up to the quantization; torch rounds it to the
    activation dtype first, as the unquantized MLP does."""
    kernels = _kernels(gate_up)
    if kernels is not None:
        return kernels.silu_mul_quantize_rows(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    return quantize_rows(F.silu(gate) * up)


def add_rmsnorm_quantize_rows(
    x: Tensor | None, residual: Tensor, weight: Tensor, eps: float
) -> tuple[Tensor, Tensor] | None:
    """RMSNorm of residual + x (M, K) (x None: of residual), in fp32 times `weight`, quantized per token: E4M3
    values (M, K) and fp32 scales (M, 1), from one Triton kernel that writes the sum into `residual` in place.
    None where that kernel cannot serve (CPU, no Triton): the caller then norms and quantizes in two steps."""
    kernels = _kernels(residual)
    if kernels is None or weight.dtype != residual.dtype or not residual.is_contiguous():
        return None
    if x is not None and (x.shape != residual.shape or x.dtype != residual.dtype or x.stride(-1) != 1):
        return None
    return kernels.add_rmsnorm_quantize_rows(x, residual, weight, eps)


def fp8_page_kernels(kv_layer: Tensor, k: Tensor, v: Tensor) -> Any:
    """The Triton kernels module when its `store_kv` can write `k` and `v` (T, kv_heads, head_dim), each
    token's heads one contiguous row, into the E4M3 pages `kv_layer` on a CUDA device; else None."""
    if kv_layer.dtype != FP8 or not TRITON_KERNELS or k.device.type != "cuda":
        return None
    rows_ok = all(t.dim() == 3 and t.stride(2) == 1 and t.stride(1) == t.shape[2] for t in (k, v))
    return triton_module("fp8_kernels") if rows_ok and kv_layer.is_contiguous() else None


def quantize_weight(weight: Tensor) -> tuple[Tensor, Tensor]:
    """Per-output-channel quantization of a weight (N, K): E4M3 values (N, K) and fp32 scales (N,)."""
    scale = scales(weight)  # (N, 1)
    return to_fp8(weight, scale), scale.flatten()


def dequantize(values: Tensor, scale: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """`values` (E4M3) times `scale` (broadcast), in `dtype`."""
    return (values.to(torch.float32) * scale).to(dtype)


@functools.cache
def triton_module(name: str) -> Any:
    """`executor.model.<name>`, a module of Triton kernels (`fp8_kernels`, `fp8_attention`), or None where
    Triton is not installed (CPU installs) or cannot build here: the caller's torch or FlashInfer path
    serves instead."""
    try:
        return importlib.import_module(f"executor.model.{name}")
    except Exception as err:
        log.info("no Triton module %s (%s): torch ops or FlashInfer serve instead", name, err)
        return None


def _kernels(x: Tensor) -> Any:
    """The Triton kernels module when `x` can take them (2-D, CUDA, fp16/bf16/fp32), else None."""
    if not TRITON_KERNELS or x.device.type != "cuda" or x.dim() != 2 or x.stride(-1) != 1:
        return None
    return triton_module("fp8_kernels")


def scaled_gemm_ok(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether activations of `dtype` on `device` take the FP8 tensor-core GEMM: bf16 on a CUDA device of
    compute capability >= 8.9 (Ada, Hopper and later)."""
    if device.type != "cuda" or dtype != torch.bfloat16:
        return False
    return _fp8_capable(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _fp8_capable(index: int) -> bool:
    return torch.cuda.get_device_capability(index) >= (8, 9)


class Fp8Linear(nn.Module):
    """`nn.Linear` over an E4M3 weight with per-output-channel scales, and a bias kept unquantized."""

    weight: Tensor
    weight_scale: Tensor

    def __init__(self, weight: Tensor, weight_scale: Tensor, bias: Tensor | None) -> None:
        super().__init__()
        if weight.dtype != FP8 or weight.dim() != 2 or weight_scale.shape != (weight.shape[0],):
            raise ValueError("expected an E4M3 weight (N, K) and N fp32 scales")
        self.out_features, self.in_features = weight.shape
        self.register_buffer("weight", weight)
        self.register_buffer("weight_scale", weight_scale.float().reshape(1, -1).contiguous())  # (1, N)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    @classmethod
    @torch.no_grad()
    def from_linear(cls, linear: nn.Linear) -> Fp8Linear:
        weight, scale = quantize_weight(linear.weight)
        bias = None if linear.bias is None else linear.bias.detach()
        return cls(weight, scale, bias)

    def forward(self, x: Tensor | Fp8Rows, out: Tensor | None = None) -> Tensor:
        """The product of `x` (.., K), or of rows quantized before; `out`, rows (M, N) to write it into."""
        if isinstance(x, Fp8Rows):  # quantized by the norm before this layer
            return self.gemm(x.values, x.scale, x.dtype, out)
        shape = x.shape
        values, scale = quantize_rows(x.reshape(-1, shape[-1]))
        return self.gemm(values, scale, x.dtype, out).view(*shape[:-1], self.out_features)

    def forward_silu_mul(self, gate_up: Tensor) -> Tensor:
        """This layer applied to silu(gate) * up of `gate_up` (M, 2 * in_features), one quantizing kernel."""
        values, scale = silu_mul_quantize_rows(gate_up)
        return self.gemm(values, scale, gate_up.dtype)

    def gemm(self, values: Tensor, scale: Tensor, dtype: torch.dtype, out: Tensor | None = None) -> Tensor:
        """(M, N) in `dtype` from quantized rows (M, K) and their scales (M, 1), plus the bias; written into
        `out` (M, N) when given."""
        if scaled_gemm_ok(values.device, dtype):
            out = torch._scaled_mm(
                values,
                self.weight.t(),
                scale_a=scale,
                scale_b=self.weight_scale,
                out_dtype=dtype,
                use_fast_accum=FAST_ACCUM,
                **({} if out is None else {"out": out}),
            )
        else:  # reference: dequantize both sides, multiply in the activation dtype
            weight = dequantize(self.weight, self.weight_scale.t(), dtype)
            product = dequantize(values, scale, dtype) @ weight.t()
            out = product if out is None else out.copy_(product)
        if self.bias is not None:
            out = out.add_(self.bias)
        return out

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, fp8_e4m3, per-channel"


def quantize_model(model: nn.Module, method: str) -> nn.Module:
    """Replace every `nn.Linear` inside `model.layers` (attention q/k/v and output, MLP gate/up and down)
    by its `Fp8Linear`, in place, one at a time; the LM head, embeddings and norms stay as they are."""
    if method not in QUANTIZATIONS:
        raise ValueError(f"unknown quantization {method!r}; expected one of {', '.join(QUANTIZATIONS)}")
    layers = model.get_submodule("layers")
    for name, module in list(layers.named_modules()):
        if type(module) is nn.Linear:
            parent, _, attr = name.rpartition(".")
            setattr(layers.get_submodule(parent) if parent else layers, attr, Fp8Linear.from_linear(module))
    return model


def quantized(model: nn.Module) -> bool:
    """Whether any of the model's linear layers is an `Fp8Linear`."""
    return any(isinstance(module, Fp8Linear) for module in model.modules())


def weight_bytes(model: nn.Module) -> int:
    """Bytes of the model's parameters and buffers (what a worker's weights take on its device)."""
    tensors = [*model.parameters(), *model.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)
