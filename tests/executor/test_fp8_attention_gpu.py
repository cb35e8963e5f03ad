"""`Fp8PageAttention`, the Triton decode attention over FP8 pages, on a CUDA device
(`python -m pytest -q -m gpu tests/executor/test_fp8_attention_gpu.py`).

Against the torch reference over the very same E4M3 pages the only differences are fp16 queries and the
summation order (`SAME_INPUTS`, as FlashInfer's bound over FP8 pages in test_fp8_kv_gpu.py).
"""

from __future__ import annotations

import random

import pytest
import torch
from executor_helpers import relative_error, small_config

from executor.model.attention import AttentionLayout, TorchAttention
from executor.model.config import Family
from executor.model.cuda_graphs import GraphedModelRunner
from executor.model.flashinfer_backend import flashinfer_available, make_backend
from executor.model.forward import ModelRunner
from executor.model.kv_cache import PagedKVCache
from executor.model.loading import random_model
from executor.model.microbatch import ForwardItem, Phase
from sangam.hardware import PAGE, pages_for
from sangam.kv import PagePool

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

FP8 = torch.float8_e4m3fn
HEAD_DIM = 128
SAME_INPUTS = 1e-2


def decode_case(
    heads: int, kv_heads: int, query_lens: list[int], kv_lens: list[int], seed: int
) -> tuple[AttentionLayout, torch.Tensor, torch.Tensor]:
    """A layout over shuffled pages, bf16 queries and FP8 pages (values past E4M3's unit scale)."""
    order = list(range(sum(pages_for(n) for n in kv_lens) + 5))
    random.Random(seed).shuffle(order)
    tables, used = [], 0
    for kv_len in kv_lens:
        tables.append(order[used : used + pages_for(kv_len)])
        used += pages_for(kv_len)
    generator = torch.Generator(device="cuda").manual_seed(seed)
    kv = 3 * torch.randn(len(order), 2, PAGE, kv_heads, HEAD_DIM, device="cuda", generator=generator)
    q = torch.randn(sum(query_lens), heads, HEAD_DIM, device="cuda", generator=generator)
    return AttentionLayout.build(query_lens, kv_lens, tables), q.to(torch.bfloat16), kv.to(FP8)


@pytest.mark.parametrize(
    ("heads", "kv_heads", "rows", "splits"),
    [(32, 32, 32, 1), (32, 32, 32, 4), (28, 4, 33, 1), (28, 4, 33, 16)],
    ids=["llada", "llada-split", "dream", "dream-split"],
)
@pytest.mark.parametrize("heads_first", [False, True], ids=["items-first", "heads-first"])
def test_the_page_kernel_matches_torch_over_the_same_fp8_pages(
    heads: int, kv_heads: int, rows: int, splits: int, heads_first: bool
) -> None:
    from executor.model.fp8_attention import Fp8PageAttention

    # ragged: a short item, one under a page, one of a single position, an entry without rows
    query_lens, kv_lens = [rows, rows, rows - 5, 1, 0], [1819, 45, 7, 1, 16]
    layout, q, kv = decode_case(heads, kv_heads, query_lens, kv_lens, seed=heads + splits)
    attention = Fp8PageAttention(
        heads,
        kv_heads,
        HEAD_DIM,
        items=len(kv_lens),
        rows=rows,
        max_pages=len(kv),
        device="cuda",
        multiprocessors=132,
        splits=splits,
    )
    attention.heads_first = heads_first
    attention.plan(layout)
    reference = TorchAttention()
    reference.plan(layout)
    actual = attention.run(q, kv)
    expected = reference.run(q, kv)
    assert relative_error(actual, expected) < SAME_INPUTS
    for item in range(len(kv_lens)):  # each item alone, so a short one cannot hide in the mean
        rows_of = slice(int(layout.qo_indptr[item]), int(layout.qo_indptr[item + 1]))
        if rows_of.stop > rows_of.start:
            assert relative_error(actual[rows_of], expected[rows_of]) < SAME_INPUTS


def test_a_layout_the_kernel_cannot_serve_is_refused() -> None:
    from executor.model.fp8_attention import Fp8PageAttention

    layout, q, kv = decode_case(8, 8, [32, 32], [600, 90], seed=2)
    with pytest.raises(ValueError, match="power of 2"):
        Fp8PageAttention(8, 8, HEAD_DIM, items=2, rows=32, max_pages=len(kv), device="cuda",
                         multiprocessors=132, splits=3)  # fmt: skip
    attention = Fp8PageAttention(
        8, 8, HEAD_DIM, items=2, rows=32, max_pages=len(kv), device="cuda", multiprocessors=132, splits=2
    )
    with pytest.raises(ValueError, match="no KV"):
        attention.plan(AttentionLayout.build([32, 32], [600, 0], [layout.kv_indices.tolist(), []]))
    attention.plan(layout)
    with pytest.raises(ValueError, match="query rows"):
        attention.run(q[:40], kv)  # the layout reads 64 rows


def test_the_page_kernel_reads_strided_queries_and_replans_in_place() -> None:
    from executor.model.fp8_attention import Fp8PageAttention

    first, q, kv = decode_case(8, 8, [32, 32], [600, 90], seed=1)
    pages = first.kv_indices.tolist()
    second = AttentionLayout.build([32, 32], [90, 600], [pages[38:], list(range(len(kv)))])
    qkv = torch.cat([q, q, q], dim=1)  # q as the qkv projection's strided view
    attention = Fp8PageAttention(
        8, 8, HEAD_DIM, items=2, rows=32, max_pages=len(kv), device="cuda", multiprocessors=132
    )
    for layout in (first, second):
        attention.plan(layout)
        reference = TorchAttention()
        reference.plan(layout)
        assert relative_error(attention.run(qkv[:, :8], kv), reference.run(q, kv)) < SAME_INPUTS


@pytest.mark.skipif(not flashinfer_available(), reason="decode graphs need flashinfer")
@pytest.mark.parametrize("family", list(Family))
def test_decode_graphs_over_fp8_pages_run_the_page_kernel(family: Family) -> None:
    """Graphed decodes on the page kernel against the torch reference over the same pages: as close as
    eager FlashInfer is (both read fp16 queries; a 2-layer random model amplifies their roundoff)."""
    from executor.model.fp8_attention import Fp8PageAttention

    model = random_model(small_config(family), device="cuda", seed=5, std=0.1)
    cache = PagedKVCache.for_model(PagePool(512), model.config, dtype=FP8, device="cuda")
    runner = ModelRunner(model, cache, make_backend("cuda", model.config, dtype=model.dtype, kv_dtype=FP8))
    reference = ModelRunner(model, cache, TorchAttention())
    tokens = {}
    for rid in range(3):
        generator = torch.Generator().manual_seed(rid)
        ids = torch.randint(0, model.config.mask_id, (90 + 41 * rid,), generator=generator)
        tokens[rid] = torch.cat([ids, torch.full((64,), model.config.mask_id)])
        cache.pool.allocate(rid, pages_for(len(tokens[rid])))
        runner.forward([ForwardItem(rid, Phase.PREFILL, tokens[rid], 90 + 41 * rid)])
    graphed = GraphedModelRunner(runner, buckets=(1, 4))
    assert graphed.captured
    assert all(isinstance(graphed._buckets[size].backend, Fp8PageAttention) for size in (1, 4))
    items = [ForwardItem(rid, Phase.DECODE, tokens[rid], 90 + 41 * rid) for rid in range(3)]
    for batch in (items, items[:1], items[1:]):  # bucket 4 replanned with another composition
        expected = reference.forward(batch)
        flashinfer = relative_error(runner.forward(batch), expected)
        page_kernel = relative_error(graphed.forward(batch), expected)
        assert page_kernel < max(SAME_INPUTS, 2 * flashinfer), (page_kernel, flashinfer)
    graphed.close()
