"""`--kv-cache-dtype fp8` on CPU: E4M3 pages, saturating writes, and attention and logits within E4M3's
rounding of the fp32-KV results.

The bounds come from E4M3's unit roundoff, 2^-4 (3 mantissa bits; bf16 has 7, so 2^-8): quantizing K and V
to E4M3 perturbs each normal element by at most that share of its magnitude, and an attention output is a
softmax-weighted average of V rows, so its mean relative error stays near the same share (measured: 3.7-3.8%
on random K/V). Through a model the errors of both layers compound, so the logits are bounded against the
same forward on bf16 pages: E4M3's roundoff is 16 times bf16's, and the measured ratio of the errors is
15-26 on the tiny models (mean relative error 8-14% against 0.4-0.8%).
"""

from __future__ import annotations

import types

import pytest
import torch
from executor_helpers import relative_error
from torch import Tensor

from executor.model import flashinfer_backend
from executor.model.attention import AttentionLayout, TorchAttention
from executor.model.config import Family, tiny
from executor.model.flashinfer_backend import query_dtype
from executor.model.forward import ModelRunner
from executor.model.kv_cache import KVSlots, PagedKVCache, kv_dtype
from executor.model.loading import random_model
from executor.model.microbatch import ForwardItem, Phase
from executor.transfer.links import KVPacker
from sangam.hardware import PAGE, pages_for
from sangam.kv import PagePool

FP8 = torch.float8_e4m3fn
E4M3_ROUNDOFF = 2.0**-4
FP8_OVER_BF16 = 32  # twice the ratio of the unit roundoffs (16): the measured 15-26 with margin


def test_fp8_pages_hold_e4m3_in_half_the_bytes_of_bf16_pages() -> None:
    assert kv_dtype("fp8", torch.bfloat16) == FP8 and kv_dtype("auto", torch.bfloat16) == torch.bfloat16
    config = tiny(Family.DREAM)
    fp8 = PagedKVCache.for_model(PagePool(8), config, dtype=FP8, device="cpu")
    bf16 = PagedKVCache.for_model(PagePool(8), config, dtype=torch.bfloat16, device="cpu")
    # a KV transfer moves every layer's pages: half the bytes per page
    fp8_page = KVPacker(fp8.layers, host_staging=False).bytes_per_page
    assert 2 * fp8_page == KVPacker(bf16.layers, host_staging=False).bytes_per_page
    shape = config.shape
    assert fp8_page == shape.layers * 2 * PAGE * shape.kv_heads * shape.head_dim


def test_fp8_writes_saturate_at_448_instead_of_overflowing_to_nan() -> None:
    """Pins the torch behaviour the writes rely on: its cast into E4M3 saturates."""
    cache = PagedKVCache(PagePool(2), 1, 1, 8, dtype=FP8, device="cpu")
    cache.pool.allocate(0, 1)
    k = torch.tensor([1e4, -1e4, 500.0, 3.0, 0.0, -2.5, 448.0, 1e-3]).view(8, 1, 1).expand(8, 1, 8)
    cache.write(0, KVSlots.of(cache.page_table(0), torch.arange(8)), k, -k)
    got_k, got_v = cache.gather(0, 0, 8)
    expected = torch.tensor([448.0, -448.0, 448.0, 3.0, 0.0, -2.5, 448.0, 1e-3]).to(FP8).float()
    assert torch.equal(got_k.float()[:, 0, 0], expected) and torch.equal(got_v.float()[:, 0, 0], -expected)


@pytest.mark.parametrize("seed", range(3))
def test_attention_over_fp8_pages_is_within_e4m3_roundoff(seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    kv_len, rows, heads, kv_heads, head_dim = 300, 32, 4, 2, 64
    kv = torch.randn(pages_for(kv_len), 2, PAGE, kv_heads, head_dim, generator=generator)
    q = torch.randn(rows, heads, head_dim, generator=generator)
    attention = TorchAttention()
    attention.plan(AttentionLayout.build([rows], [kv_len], [list(range(pages_for(kv_len)))]))
    exact = attention.run(q, kv)
    assert relative_error(attention.run(q, kv.to(FP8)), exact) <= E4M3_ROUNDOFF


def block_logits(family: Family, seed: int, dtype: torch.dtype) -> Tensor:
    """A tiny model's prefill and then decode logits of one request's block over pages of `dtype`."""
    model = random_model(tiny(family), dtype=torch.float32, seed=seed, std=0.2)
    runner = ModelRunner(
        model, PagedKVCache.for_model(PagePool(64), model.config, dtype=dtype, device="cpu"), TorchAttention()
    )
    ids = torch.randint(0, model.config.mask_id, (90,), generator=torch.Generator().manual_seed(seed))
    tokens = torch.cat([ids, torch.full((64,), model.config.mask_id)])
    runner.cache.pool.allocate(1, pages_for(len(tokens)))
    prefill = runner.forward([ForwardItem(1, Phase.PREFILL, tokens, 90)])
    decode = runner.forward([ForwardItem(1, Phase.DECODE, tokens, 90)])  # reads what the prefill stored
    return torch.cat([prefill, decode])


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("family", list(Family))
def test_fp8_kv_logits_stay_within_e4m3_rounding_of_fp32_kv(family: Family, seed: int) -> None:
    exact = block_logits(family, seed, torch.float32)
    fp8 = relative_error(block_logits(family, seed, FP8), exact)
    bf16 = relative_error(block_logits(family, seed, torch.bfloat16), exact)
    assert 0 < fp8 <= FP8_OVER_BF16 * bf16


def test_fa2_is_planned_and_run_with_fp16_queries_and_a_bf16_output_over_fp8_pages(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: dict[str, object] = {}

    class Wrapper:  # FlashInfer's BatchPrefillWithPagedKVCacheWrapper, as far as FlashInferAttention uses it
        def __init__(self, workspace: Tensor, layout: str, backend: str) -> None:
            calls["backend"] = backend

        def plan(self, *args: object, **kwargs: object) -> None:
            calls["plan"] = kwargs

        def run(self, q: Tensor, kv: Tensor, out: Tensor) -> Tensor:
            calls["run"] = (q.dtype, kv.dtype, out.dtype)
            return out

    fake = types.SimpleNamespace(BatchPrefillWithPagedKVCacheWrapper=Wrapper, __version__="fake")
    monkeypatch.setattr(flashinfer_backend, "flashinfer_module", lambda: fake)
    attention = flashinfer_backend.FlashInferAttention(
        4, 2, 16, dtype=torch.bfloat16, kv_dtype=FP8, device="cpu", workspace=torch.empty(1)
    )
    attention.plan(AttentionLayout.build([3], [20], [[0, 1]]))
    out = attention.run(
        torch.randn(3, 4, 16, dtype=torch.bfloat16), torch.zeros(2, 2, PAGE, 2, 16, dtype=FP8)
    )
    plan = calls["plan"]
    assert isinstance(plan, dict) and calls["backend"] == "fa2"
    assert (plan["q_data_type"], plan["kv_data_type"], plan["o_data_type"]) == (
        torch.float16,
        FP8,
        torch.bfloat16,
    )
    assert calls["run"] == (torch.float16, FP8, torch.bfloat16) and out.dtype == torch.bfloat16


def test_fa2_reads_queries_in_fp16_over_fp8_pages_only() -> None:
    # FlashInfer's fa2 widens FP8 pages to the query dtype: in one Hopper instruction to fp16, not to bf16
    assert query_dtype(torch.bfloat16, FP8) == torch.float16
    assert query_dtype(torch.float16, FP8) == torch.float16
    assert query_dtype(torch.bfloat16, torch.bfloat16) == torch.bfloat16
    assert query_dtype(torch.float16, torch.float16) == torch.float16
