"""`TritonPrefillAttention`, the Triton prefill attention over a forward's own K/V rows, on a CUDA device
(`python -m pytest -q -m gpu tests/executor/test_prefill_kernel_gpu.py`)."""

from __future__ import annotations

import pytest
import torch
from executor_helpers import relative_error, small_config

from executor.model import prefill_attention
from executor.model.attention import indptr
from executor.model.config import Family
from executor.model.flashinfer_backend import FlashInferPrefillAttention, flashinfer_available
from executor.model.prefill_attention import TorchPrefillAttention, make_prefill_attention

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
prefill_kernel = pytest.importorskip("executor.model.prefill_kernel")

DTYPE = torch.bfloat16
HEAD_DIM = 128
TOLERANCE = 1e-2  # mean relative error of bf16 results computed along different paths
FP8 = torch.float8_e4m3fn


@pytest.mark.parametrize(("heads", "kv_heads"), [(8, 8), (8, 2), (28, 4)], ids=["mha", "gqa4", "dream"])
@pytest.mark.parametrize("config", [(128, 64, 8, 3), (128, 128, 8, 2), (64, 64, 4, 3)])
def test_triton_prefill_attention_over_own_rows_equals_sdpa(
    heads: int, kv_heads: int, config: tuple[int, int, int, int]
) -> None:
    generator = torch.Generator(device="cuda").manual_seed(heads * kv_heads)
    block_m, block_n, warps, stages = config
    attention = prefill_kernel.TritonPrefillAttention(
        heads, kv_heads, HEAD_DIM, device="cuda", block_m=block_m, block_n=block_n, warps=warps, stages=stages
    )
    reference = TorchPrefillAttention()
    # ragged with partial tiles and K/V blocks, a single row, a whole number of tiles, then a replan
    for lengths in ([300, 77, 1000], [1, 2048], [33], [256, 128]):
        width = (heads + 2 * kv_heads) * HEAD_DIM
        qkv = torch.randn(sum(lengths), width, dtype=DTYPE, device="cuda", generator=generator)
        q, k, v = qkv.split([heads * HEAD_DIM, kv_heads * HEAD_DIM, kv_heads * HEAD_DIM], dim=-1)
        q, k, v = q.view(-1, heads, HEAD_DIM), k.view(-1, kv_heads, HEAD_DIM), v.view(-1, kv_heads, HEAD_DIM)
        offsets = indptr(lengths)
        expected, actual = torch.empty_like(q), torch.full_like(q, float("nan"))
        reference.plan(offsets)
        reference.run(q, k, v, expected)
        attention.plan(offsets)
        attention.run(q, k, v, actual)
        assert relative_error(actual, expected) < TOLERANCE  # also: every row written (no NaN left)
        assert float((actual.float() - expected.float()).abs().max()) < 0.05


def test_prefills_over_fp8_pages_on_cuda_take_the_triton_kernel_unless_switched_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = small_config(Family.DREAM)
    chosen = make_prefill_attention("cuda", config, DTYPE, FP8)
    assert isinstance(chosen, prefill_kernel.TritonPrefillAttention)
    assert make_prefill_attention("cuda", config, DTYPE, DTYPE) is None
    monkeypatch.setattr(prefill_attention, "TRITON_KERNEL", False)
    fallback = make_prefill_attention("cuda", config, DTYPE, FP8)
    expected = FlashInferPrefillAttention if flashinfer_available() else TorchPrefillAttention
    assert isinstance(fallback, expected)
