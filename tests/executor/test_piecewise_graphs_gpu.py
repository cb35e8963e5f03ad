"""`PiecewiseGraphs` on a CUDA device: an FP8 model's body replayed in pieces between eager attention
calls, against the same model's eager forward
(`python -m pytest -q -m gpu tests/executor/test_piecewise_graphs_gpu.py`).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from executor_helpers import relative_error, run_microbatch, small_config
from torch import Tensor

from executor.model.config import Family
from executor.model.flashinfer_backend import flashinfer_available, make_backend
from executor.model.forward import ModelRunner
from executor.model.fp8 import quantize_model
from executor.model.kv_cache import PagedKVCache
from executor.model.loading import random_model
from executor.model.microbatch import ForwardItem, Phase
from executor.model.piecewise_graphs import PiecewiseGraphs
from executor.model.prefill_attention import make_prefill_attention
from executor.model.transformer import Transformer
from executor.worker.engine import build_runner
from sangam.hardware import pages_for
from sangam.kv import PagePool

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(not flashinfer_available(), reason="needs flashinfer"),
]

FP8 = torch.float8_e4m3fn
# two prefills with two decodes between: 859 + 33 + 33 + 141 rows (LLaDA 1,064: the 2,048 bucket), their
# decodes' own prefills 364 and 104 rows (the 512 and 128 buckets): every microbatch padded
MIXED = [(795, Phase.PREFILL), (300, Phase.DECODE), (40, Phase.DECODE), (77, Phase.PREFILL)]


def fp8_model(family: Family) -> Transformer:
    model = random_model(small_config(family), device="cuda", seed=2, std=0.1)
    quantize_model(model, "fp8")
    return model


def counted(pieces: PiecewiseGraphs) -> list[bool]:
    """Whether each of the later `pieces.run` calls replayed its graphs (False: no bucket held it)."""
    replays: list[bool] = []
    run = pieces.run

    def counting(*args: Any) -> tuple[Tensor, Tensor] | None:
        body = run(*args)
        replays.append(body is not None)
        return body

    pieces.run = counting  # type: ignore[method-assign]
    return replays


def runner(model: Transformer, pieces: PiecewiseGraphs | None, kv_dtype: torch.dtype = FP8) -> ModelRunner:
    config = model.config
    cache = PagedKVCache.for_model(PagePool(512), config, dtype=kv_dtype, device="cuda")
    backend = make_backend("cuda", config, dtype=model.dtype, kv_dtype=kv_dtype)
    prefill = make_prefill_attention("cuda", config, model.dtype, kv_dtype)
    return ModelRunner(model, cache, backend, prefill, pieces)


@pytest.mark.parametrize("kv_dtype", [FP8, torch.bfloat16], ids=["fp8-kv", "bf16-kv"])
@pytest.mark.parametrize("family", list(Family))
def test_padded_microbatches_from_the_graphs_match_the_eager_forward(
    family: Family, kv_dtype: torch.dtype
) -> None:
    model = fp8_model(family)
    pieces = PiecewiseGraphs(model, buckets=(128, 512, 2048))
    replays = counted(pieces)
    _, eager = run_microbatch(runner(model, None, kv_dtype), MIXED)
    _, graphed = run_microbatch(runner(model, pieces, kv_dtype), MIXED)
    assert replays and all(replays)  # the decodes' own prefills and the microbatch, each from a bucket
    for item in range(len(MIXED)):  # a padded GEMM may sum in another order: bf16 roundoff only
        assert relative_error(graphed[item], eager[item]) < 1e-2


def test_an_unpadded_prefill_is_bit_identical_and_one_past_the_buckets_runs_eagerly() -> None:
    model = fp8_model(Family.LLADA)
    pieces = PiecewiseGraphs(model, buckets=(128, 384))
    replays = counted(pieces)
    for prompt in (320, 900):  # 384 rows: the bucket exactly; 964: no bucket, the eager forward
        items = [(prompt, Phase.PREFILL)]
        assert torch.equal(
            run_microbatch(runner(model, pieces), items)[1], run_microbatch(runner(model, None), items)[1]
        )
    assert replays == [True, False]


def test_padding_rows_store_no_kv() -> None:
    """Rows past the microbatch's own hold the last step's tokens: none of them may reach a page."""
    model = fp8_model(Family.DREAM)
    graphed = runner(model, PiecewiseGraphs(model, buckets=(512,)))
    cache = graphed.cache
    first = torch.randint(0, model.config.mask_id, (400,), generator=torch.Generator().manual_seed(1))
    cache.pool.allocate(1, pages_for(400))
    graphed.forward([ForwardItem(1, Phase.PREFILL, first, 368)])  # rows 0..399 of the bucket
    before = [layer.clone() for layer in cache.layers]
    second = torch.randint(0, model.config.mask_id, (100,), generator=torch.Generator().manual_seed(2))
    cache.pool.allocate(2, pages_for(100))
    graphed.forward([ForwardItem(2, Phase.PREFILL, second, 68)])  # 100 rows; 100..511 stale
    own = cache.page_table(2)
    for layer, old in zip(cache.layers, before, strict=True):
        untouched = torch.ones(len(layer), dtype=torch.bool)
        untouched[own] = False
        assert torch.equal(layer.view(torch.uint8)[untouched], old.view(torch.uint8)[untouched])


def test_build_runner_gives_fp8_models_piecewise_graphs_and_bf16_ones_none() -> None:
    for quantized in (True, False):
        model = random_model(small_config(Family.LLADA), device="cuda", seed=2, std=0.1)
        if quantized:
            quantize_model(model, "fp8")
        cache = PagedKVCache.for_model(PagePool(256), model.config, dtype=FP8, device="cuda")
        served = build_runner(model, cache, cuda_graphs=True)
        assert (served.runner.pieces is not None) is quantized
        assert build_runner(model, cache, cuda_graphs=False).pieces is None
