"""`--kv-cache-dtype fp8` through FlashInfer (fa2, bf16 queries read in fp16, over E4M3 pages) on a CUDA
device (`python -m pytest -q -m gpu tests/executor/test_fp8_kv_gpu.py`; they pass on an H200,
docs/executor-performance.md). The bounds follow the CPU tests'
(tests/executor/test_fp8_kv.py): E4M3's unit roundoff 2^-4 for attention over FP8 pages, and at most 32
times the bf16-KV error for a model's logits.
"""

from __future__ import annotations

import copy

import pytest
import torch
from executor_helpers import relative_error, run_microbatch, small_config
from torch import Tensor

from executor.model import cuda_graphs, forward
from executor.model.attention import AttentionLayout, TorchAttention
from executor.model.config import Family
from executor.model.cuda_graphs import GraphedModelRunner
from executor.model.flashinfer_backend import FlashInferAttention, flashinfer_available, make_backend
from executor.model.forward import ModelRunner, SlotStore
from executor.model.fp8 import fp8_page_kernels
from executor.model.kv_cache import KVSlots, PagedKVCache
from executor.model.loading import random_model
from executor.model.microbatch import ForwardItem, Phase
from executor.model.prefill_attention import TorchPrefillAttention, make_prefill_attention
from executor.model.transformer import Transformer
from sangam.hardware import BLOCK, PAGE, pages_for
from sangam.kv import PagePool

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(not flashinfer_available(), reason="needs flashinfer"),
]

FP8 = torch.float8_e4m3fn
HEAD_DIM = 128
E4M3_ROUNDOFF = 2.0**-4
FP8_OVER_BF16 = 32
SAME_INPUTS = 1e-2  # FlashInfer against torch on the same FP8 pages: bf16 arithmetic only


@pytest.mark.parametrize(("heads", "kv_heads"), [(8, 8), (28, 4)], ids=["mha", "dream"])
def test_flashinfer_over_fp8_pages_is_within_e4m3_roundoff_of_bf16_pages(heads: int, kv_heads: int) -> None:
    generator = torch.Generator(device="cuda").manual_seed(heads)
    query_lens, kv_lens = [300, 32, 33, 1000], [300, 531, 900, 1000]
    tables, used = [], 0
    for kv_len in kv_lens:
        tables.append(list(range(used, used + pages_for(kv_len))))
        used += pages_for(kv_len)
    layout = AttentionLayout.build(query_lens, kv_lens, tables)
    kv = torch.randn(
        used, 2, PAGE, kv_heads, HEAD_DIM, dtype=torch.bfloat16, device="cuda", generator=generator
    )
    q = torch.randn(
        sum(query_lens), heads, HEAD_DIM, dtype=torch.bfloat16, device="cuda", generator=generator
    )
    fp8_kv = kv.to(FP8)

    half = FlashInferAttention(heads, kv_heads, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
    half.plan(layout)
    fp8 = FlashInferAttention(heads, kv_heads, HEAD_DIM, dtype=torch.bfloat16, kv_dtype=FP8, device="cuda")
    fp8.plan(layout)
    torch_fp8 = TorchAttention()  # the CPU path's dequantize-by-cast over the very same pages
    torch_fp8.plan(layout)
    actual = fp8.run(q, fp8_kv)
    assert relative_error(actual, torch_fp8.run(q, fp8_kv)) < SAME_INPUTS
    assert relative_error(actual, half.run(q, kv)) <= E4M3_ROUNDOFF


def model_logits(model: Transformer, kv_dtype: torch.dtype, backend: str) -> Tensor:
    cache = PagedKVCache.for_model(PagePool(512), model.config, dtype=kv_dtype, device="cuda")
    attention = (
        TorchAttention()
        if backend == "torch"
        else make_backend("cuda", model.config, dtype=model.dtype, kv_dtype=kv_dtype)
    )
    assert backend == "torch" or isinstance(attention, FlashInferAttention)
    config = model.config
    prefill = make_prefill_attention("cuda", config, model.dtype, kv_dtype) if backend != "torch" else None
    runner = ModelRunner(model, cache, attention, prefill)
    out = []
    for rid, (prompt, masks) in enumerate([(300, 64), (795, 1024), (40, 32)]):
        ids = torch.randint(0, model.config.mask_id, (prompt,), generator=torch.Generator().manual_seed(rid))
        tokens = torch.cat([ids, torch.full((masks,), model.config.mask_id)])
        cache.pool.allocate(rid, pages_for(len(tokens)))
        out.append(runner.forward([ForwardItem(rid, Phase.PREFILL, tokens, prompt)]))
        out.append(runner.forward([ForwardItem(rid, Phase.DECODE, tokens, prompt)]))
    return torch.cat(out)


@pytest.mark.parametrize("family", list(Family))
def test_model_on_fp8_kv_stays_within_e4m3_rounding_of_bf16_kv(family: Family) -> None:
    model = random_model(small_config(family), device="cuda", seed=2, std=0.1)
    exact = model_logits(copy.deepcopy(model).float(), torch.float32, "torch")
    bf16 = relative_error(model_logits(model, torch.bfloat16, "flashinfer"), exact)
    fp8 = relative_error(model_logits(model, FP8, "flashinfer"), exact)
    print(f"{family.value}: logits' mean relative error, bf16 KV {bf16:.2e}, fp8 KV {fp8:.2e}")
    assert fp8 <= FP8_OVER_BF16 * bf16


@pytest.mark.parametrize("family", list(Family))
def test_a_mixed_microbatch_over_fp8_pages_equals_the_torch_path(family: Family) -> None:
    """Decodes over FlashInfer's paged plan of the microbatch's head and prefills over the Triton prefill
    kernel on their own rows, in any order, against torch attention over the same FP8 pages and rows (a
    helper's script of the same check, on other random prompts, gave 0.010-0.022 per item on an H200)."""
    model = random_model(small_config(family), device="cuda", seed=2, std=0.1)
    config = model.config
    prefill, decode = Phase.PREFILL, Phase.DECODE
    shapes = [(795, prefill), (300, decode), (40, decode), (1000, prefill), (77, prefill)]

    def logits(flashinfer: bool) -> Tensor:
        cache = PagedKVCache.for_model(PagePool(512), config, dtype=FP8, device="cuda")
        runner = (
            ModelRunner(
                model,
                cache,
                make_backend("cuda", config, dtype=model.dtype, kv_dtype=FP8),
                make_prefill_attention("cuda", config, model.dtype, FP8),
            )
            if flashinfer
            else ModelRunner(model, cache, TorchAttention(), TorchPrefillAttention())
        )
        return run_microbatch(runner, shapes)[1]

    actual, expected = logits(flashinfer=True), logits(flashinfer=False)
    for item in range(len(shapes)):
        assert relative_error(actual[item], expected[item]) < 0.05


@pytest.mark.parametrize(("heads", "kv_heads"), [(32, 32), (28, 4)], ids=["llada", "dream"])
def test_the_triton_kv_store_writes_what_the_torch_copy_writes(heads: int, kv_heads: int) -> None:
    rows, kv_width = 300, kv_heads * HEAD_DIM
    g = torch.Generator(device="cuda").manual_seed(kv_heads)
    qkv = (torch.randn(rows, heads * HEAD_DIM + 2 * kv_width, device="cuda", generator=g) * 100).bfloat16()
    qkv[::7, -5:] = 1000.0  # past E4M3's 448, in V and in K: saturates
    qkv[::5, heads * HEAD_DIM : heads * HEAD_DIM + 3] = -1000.0
    k, v = (part.view(rows, kv_heads, HEAD_DIM) for part in qkv[:, heads * HEAD_DIM :].split(kv_width, -1))
    slot = torch.randperm(64 * PAGE, device="cuda", generator=g)[:rows]  # distinct slots, scattered
    slots = KVSlots(slot // PAGE, slot % PAGE)
    pages = (64, 2, PAGE, kv_heads, HEAD_DIM)
    fused, copied = torch.zeros(pages, dtype=FP8, device="cuda"), torch.zeros(pages, dtype=FP8, device="cuda")
    assert fp8_page_kernels(fused, k, v) is not None
    SlotStore(slots)(fused, k, v)
    # torch's copy of the values saturated first: whether torch's own cast saturates has varied by version
    k_rows = slots.pages * 2 * PAGE + slots.offsets
    forward._store_rows(copied, k_rows, k.float().clamp(-448, 448))
    forward._store_rows(copied, k_rows + PAGE, v.float().clamp(-448, 448))
    assert torch.equal(fused.view(torch.uint8), copied.view(torch.uint8))  # bit for bit
    for kv in (0, 1):
        assert float(copied[slots.pages, kv, slots.offsets].float().abs().max()) == 448.0


def test_graphed_fa2_decode_over_fp8_pages_equals_eager_decode(monkeypatch: pytest.MonkeyPatch) -> None:
    """FlashInfer's graph plans over FP8 pages (where Triton's page kernel is missing; with it, see
    test_fp8_attention_gpu.py)."""
    monkeypatch.setattr(cuda_graphs, "FP8_PAGE_KERNEL", False)
    model = random_model(small_config(Family.LLADA), device="cuda", seed=3, std=0.1)
    cache = PagedKVCache.for_model(PagePool(512), model.config, dtype=FP8, device="cuda")
    runner = ModelRunner(model, cache, make_backend("cuda", model.config, dtype=model.dtype, kv_dtype=FP8))
    tokens = {}
    for rid in range(4):
        ids = torch.randint(
            0, model.config.mask_id, (100 + 37 * rid,), generator=torch.Generator().manual_seed(rid)
        )
        tokens[rid] = torch.cat([ids, torch.full((64,), model.config.mask_id)])
        cache.pool.allocate(rid, pages_for(len(tokens[rid])))
        runner.forward([ForwardItem(rid, Phase.PREFILL, tokens[rid], 100 + 37 * rid)])
    graphed = GraphedModelRunner(runner, buckets=(1, 2, 4))
    assert graphed.captured
    assert all(isinstance(graphed._buckets[size].backend, FlashInferAttention) for size in (1, 2, 4))
    items = [ForwardItem(rid, Phase.DECODE, tokens[rid], 100 + 37 * rid) for rid in range(3)]
    replayed = graphed.forward(items)
    assert replayed.shape == (3, BLOCK, model.config.shape.vocab)
    assert relative_error(replayed, runner.forward(items)) < SAME_INPUTS
    graphed.close()
