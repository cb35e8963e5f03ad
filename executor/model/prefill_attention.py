"""Prefill attention over the forward's own K/V: a prefill's queries never read the pages back.

A prefill recomputes every position of its sequence (docs/design.md section 1: a block starts with a
non-causal forward over all S tokens), so its queries attend to exactly the K/V rows this forward computed.
Over FP8 pages `ModelRunner` still stores them in the pages (the block's decodes read them there) but packs
the decodes first and hands the prefills, the microbatch's tail (`MicrobatchPlan.prefill_tail`), to a
`PrefillAttention` over the rows themselves: that avoids E4M3's rounding and FlashInfer's slow reads of FP8
pages (LLaDA-8B's 2,048-token prefill over FP8 pages on an H200: 37.8 ms read back, 34.1 ms over its own
rows; one layer's attention 351 against 187 us; docs/executor-performance.md "The sixth round"). Over bf16
pages prefills still read the pages back: exact, and as fast (53.6 against 53.4 ms).

`PrefillAttention` is planned once per microbatch with the tail's CSR row offsets and run once per layer:
`TorchPrefillAttention` (one SDPA call per sequence; CPU and checks),
`prefill_kernel.TritonPrefillAttention` (a Triton flash-attention kernel, one launch for all sequences;
CUDA) and `flashinfer_backend.FlashInferPrefillAttention` (FlashInfer's ragged batch prefill, fa2; CUDA,
fp16/bf16).
"""

from __future__ import annotations

import itertools
import logging
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from executor.model.config import ModelConfig
from executor.model.flashinfer_backend import HALF_DTYPES, FlashInferPrefillAttention, flashinfer_available
from executor.model.fp8 import FP8, triton_module

log = logging.getLogger("sangam.prefill")
TRITON_KERNEL = True  # False: FlashInfer's fa2 ragged prefill on CUDA (benchmarks compare the two)


class PrefillAttention(Protocol):
    """Non-causal attention of whole sequences over their own K/V rows, planned once per microbatch."""

    def plan(self, indptr: Tensor) -> None:
        """Sequence i owns packed rows `indptr[i]:indptr[i + 1]` (host int32) of every later `run`."""

    def run(self, q: Tensor, k: Tensor, v: Tensor, out: Tensor) -> None:
        """q (T, heads, d), k and v (T, kv_heads, d), strided rows allowed -> `out` (T, heads, d)."""


def prefill_tiles(indptr: Tensor, block_m: int) -> Tensor:
    """The tiles of `block_m` query rows of the sequences `indptr` (host CSR row offsets), (tiles, 3) int32:
    each tile's first row and its sequence's first and end rows, the longest sequences' tiles first."""
    bounds = list(itertools.pairwise(indptr.tolist()))
    longest = sorted(bounds, key=lambda span: span[0] - span[1])  # stable: ties keep their order
    rows = [(row, lo, hi) for lo, hi in longest for row in range(lo, hi, block_m)]
    return torch.tensor(rows, dtype=torch.int32).reshape(-1, 3)


class TorchPrefillAttention:
    """One SDPA call per sequence: the reference, and the CPU path."""

    def __init__(self) -> None:
        self._rows: list[slice] = []

    def plan(self, indptr: Tensor) -> None:
        bounds = indptr.tolist()
        self._rows = [slice(a, b) for a, b in itertools.pairwise(bounds)]

    def run(self, q: Tensor, k: Tensor, v: Tensor, out: Tensor) -> None:
        for rows in self._rows:
            # (1, heads, rows, d): with a batch dimension CPU SDPA takes its flash kernel (attention.py)
            q_i, k_i, v_i = (x[rows].transpose(0, 1)[None] for x in (q, k, v))
            attended = F.scaled_dot_product_attention(q_i, k_i, v_i, is_causal=False, enable_gqa=True)
            out[rows] = attended[0].transpose(0, 1)


def make_prefill_attention(
    device: torch.device | str, config: ModelConfig, dtype: torch.dtype, kv_dtype: torch.dtype
) -> PrefillAttention | None:
    """Over FP8 pages, on a CUDA device in fp16/bf16: the Triton kernel (`executor.model.prefill_kernel`)
    where Triton is installed, `TRITON_KERNEL` is on and the kernel compiles for this GPU, else FlashInfer's
    ragged prefill where it is installed; SDPA otherwise. Over other pages None: prefills read their pages
    back."""
    if kv_dtype != FP8:
        return None
    device, shape = torch.device(device), config.shape
    if device.type == "cuda" and dtype in HALF_DTYPES:
        kernel = triton_module("prefill_kernel") if TRITON_KERNEL else None
        if kernel is not None:
            heads = (shape.heads, shape.kv_heads, shape.head_dim)
            try:
                return kernel.TritonPrefillAttention(*heads, device=device, dtype=dtype)
            except Exception as err:  # e.g. a GPU with less shared memory than its tiles take
                log.warning(
                    "the Triton prefill attention cannot run here (%s): FlashInfer or SDPA instead", err
                )
        if flashinfer_available():
            return FlashInferPrefillAttention(
                shape.heads, shape.kv_heads, shape.head_dim, dtype=dtype, device=device
            )
    return TorchPrefillAttention()
