"""Piecewise graphs on CPU: bucket choice, and `ModelRunner` taking the body from its `pieces` where they
hold the microbatch, else from the model (the graphs themselves: test_piecewise_graphs_gpu.py)."""

from __future__ import annotations

import itertools

import pytest
import torch
from executor_helpers import dense_attention, run_microbatch
from hypothesis import given
from hypothesis import strategies as st
from torch import Tensor

from executor.model.attention import TorchAttention
from executor.model.config import Family, tiny
from executor.model.forward import ModelRunner
from executor.model.fp8 import quantize_model
from executor.model.kv_cache import PagedKVCache
from executor.model.loading import random_model
from executor.model.microbatch import Phase
from executor.model.piecewise_graphs import ROWS, AttentionInto, PiecewiseGraphs, bucket_rows
from executor.model.prefill_attention import TorchPrefillAttention
from executor.model.transformer import Transformer
from executor.worker.engine import build_runner
from sangam.kv import PagePool


@given(st.integers(1, 5000), st.lists(st.integers(1, 40), min_size=1, max_size=6, unique=True))
def test_the_bucket_is_the_smallest_that_holds_the_tokens(tokens: int, steps: list[int]) -> None:
    buckets = sorted(step * ROWS for step in steps)
    rows = bucket_rows(tokens, buckets)
    if rows is None:
        assert tokens > buckets[-1]
    else:
        assert rows >= tokens and all(b < tokens for b in buckets if b < rows)


def test_buckets_are_multiples_of_the_gemm_row_tile() -> None:
    model = random_model(tiny(Family.LLADA), dtype=torch.float32, seed=1)
    with pytest.raises(ValueError, match="multiples of 128"):
        PiecewiseGraphs(model, buckets=(128, 300))


@pytest.mark.parametrize("quantized", [False, True], ids=["fp32", "fp8"])
def test_the_body_leaves_every_layers_qkv_in_the_rows_it_is_given(quantized: bool) -> None:
    """What lets the piecewise graphs skip copying q, k and v: each layer's projection lands in the static
    rows, and the body's output is the eager body's."""
    model = random_model(tiny(Family.DREAM), dtype=torch.float32, seed=3, std=0.2)  # Dream: q/k/v biases
    if quantized:
        quantize_model(model, "fp8")
    tokens = torch.randint(0, model.config.mask_id, (40,), generator=torch.Generator().manual_seed(4))
    positions = torch.arange(40)
    rows = torch.full((40, model.config.shape.qkv_width), float("nan"))
    projections: list[Tensor] = []

    def attend(layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        assert v.untyped_storage().data_ptr() == rows.untyped_storage().data_ptr()  # q, k: CPU RoPE's copies
        projections.append(rows.clone())
        return dense_attention(layer, q, k, v)

    with torch.inference_mode():
        expected = model.body(tokens, positions, dense_attention)
        actual = model.body(tokens, positions, attend, rows)
    assert all(torch.equal(a, b) for a, b in zip(actual, expected, strict=True))
    assert len(projections) == model.config.shape.layers
    assert not any(torch.equal(a, b) for a, b in itertools.pairwise(projections))  # each layer its own
    assert not rows.isnan().any()


class FakePieces:
    """The body as `PiecewiseGraphs.run` returns it, for microbatches of at most `limit` tokens: each
    layer's attention written into rows of its own (NaN until then), as into the graphs' static rows."""

    def __init__(self, model: Transformer, limit: int) -> None:
        self.model, self.limit = model, limit
        self.sizes: list[int] = []

    def run(self, tokens: Tensor, positions: Tensor, attend: AttentionInto) -> tuple[Tensor, Tensor] | None:
        self.sizes.append(len(tokens))
        if len(tokens) > self.limit:
            return None

        def into(layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            out = torch.full_like(q, float("nan"))
            assert attend(layer, q, k, v, out) is out and not out.isnan().any()  # every row written
            return out

        return self.model.body(tokens, positions, into)


@pytest.mark.parametrize("prefill", [None, TorchPrefillAttention()], ids=["over pages", "own rows"])
def test_the_runner_takes_the_body_from_its_pieces_and_falls_back_to_the_model(
    prefill: TorchPrefillAttention | None,
) -> None:
    """Over pages every row attends through the backend; over their own rows the prefill's rows through
    `prefill`, after the decode's rows (the microbatch's tail)."""
    model = random_model(tiny(Family.DREAM), dtype=torch.float32, seed=3, std=0.2)
    shapes = [(40, Phase.DECODE), (70, Phase.PREFILL)]  # 104 rows, then 33 + 134 in the microbatch

    def logits(pieces: FakePieces | None) -> Tensor:
        cache = PagedKVCache.for_model(PagePool(64), model.config, dtype=torch.float32, device="cpu")
        runner = ModelRunner(model, cache, TorchAttention(), prefill, pieces)  # type: ignore[arg-type]
        return run_microbatch(runner, shapes)[1]

    expected = logits(None)
    pieces = FakePieces(model, limit=150)
    assert torch.equal(logits(pieces), expected)
    assert pieces.sizes == [104, 167]  # the decode's own prefill from the pieces; the microbatch past them


def test_cpu_runners_have_no_pieces() -> None:
    model = random_model(tiny(Family.LLADA), dtype=torch.float32, seed=1)
    cache = PagedKVCache.for_model(PagePool(8), model.config, dtype=torch.float32, device="cpu")
    runner = build_runner(model, cache, cuda_graphs=True)
    assert isinstance(runner, ModelRunner) and runner.pieces is None
