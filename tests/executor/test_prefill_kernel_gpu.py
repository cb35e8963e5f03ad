"""`TritonPrefillAttention`, the Triton prefill attention over a forward's own K/V rows, on a CUDA device
(`python -m pytest -q -m gpu tests/executor/test_prefill_kernel_gpu.py`)."""

from __future__ import annotations

import pytest
import torch
from executor_helpers import check_prefill_attention, small_config

from executor.model import prefill_attention
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
FP8 = torch.float8_e4m3fn


@pytest.mark.parametrize(("heads", "kv_heads"), [(8, 8), (8, 2), (28, 4)], ids=["mha", "gqa4", "dream"])
@pytest.mark.parametrize("config", [(128, 128, 8, 3), (128, 64, 8, 3), (128, 128, 8, 2), (64, 64, 4, 3)])
def test_triton_prefill_attention_over_own_rows_equals_sdpa(
    heads: int, kv_heads: int, config: tuple[int, int, int, int]
) -> None:
    attention = prefill_kernel.TritonPrefillAttention(heads, kv_heads, HEAD_DIM, device="cuda", config=config)
    check_prefill_attention(attention, heads, kv_heads, HEAD_DIM)


@pytest.mark.parametrize("wrong", ["q", "k", "v", "out"])
def test_triton_prefill_attention_refuses_rows_of_other_heads(wrong: str) -> None:
    attention = prefill_kernel.TritonPrefillAttention(8, 2, HEAD_DIM, device="cuda", config=(64, 64, 4, 3))
    attention.plan(torch.tensor([0, 4], dtype=torch.int32))
    heads = {"q": 8, "k": 2, "v": 2, "out": 8}
    heads[wrong] += 1
    rows = {name: torch.zeros(4, n, HEAD_DIM, dtype=DTYPE, device="cuda") for name, n in heads.items()}
    with pytest.raises(ValueError, match="prefill attention of 8 query and 2 KV heads"):
        attention.run(rows["q"], rows["k"], rows["v"], rows["out"])


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
