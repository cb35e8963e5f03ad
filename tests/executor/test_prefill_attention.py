"""Prefills attend over their own K/V rows: the microbatch's prefill tail, and the forward around it.

A prefill's queries attend to exactly the K/V of its own span, so the trailing prefills of a microbatch run
through a `PrefillAttention` over those rows while the items before them attend over their pages. The
results must equal attention over the pages where the pages hold the same values (fp32), and over FP8 pages
the prefill must see its unrounded K/V while the pages still receive them for the block's decodes.
"""

from __future__ import annotations

import itertools
import types

import pytest
import torch
from executor_helpers import relative_error, run_microbatch
from hypothesis import given
from hypothesis import strategies as st
from torch import Tensor

from executor.model import flashinfer_backend, prefill_attention
from executor.model.attention import AttentionLayout, TorchAttention
from executor.model.config import Family, tiny
from executor.model.forward import ModelRunner
from executor.model.kv_cache import PagedKVCache, gather_kv
from executor.model.loading import random_model
from executor.model.microbatch import ForwardItem, Phase, plan_microbatch
from executor.model.prefill_attention import TorchPrefillAttention, make_prefill_attention, prefill_tiles
from executor.model.transformer import Transformer
from executor.worker.engine import build_runner
from sangam.hardware import BLOCK, pages_for
from sangam.kv import PagePool

ATOL = 2e-5
FP8 = torch.float8_e4m3fn


def item(rid: int, phase: Phase, prompt: int, masks: int = 64) -> ForwardItem:
    tokens = torch.cat([torch.arange(prompt) % 50, torch.full((masks,), 99)])
    return ForwardItem(rid, phase, tokens, prompt)


@given(st.lists(st.tuples(st.sampled_from(list(Phase)), st.integers(1, 80)), min_size=1, max_size=6))
def test_the_prefill_tail_is_the_trailing_run_of_prefills(shapes: list[tuple[Phase, int]]) -> None:
    items = [item(rid, phase, prompt) for rid, (phase, prompt) in enumerate(shapes)]
    tables = [list(range(pages_for(i.seq_len))) for i in items]
    plan = plan_microbatch(items, tables, 0, 1000, torch.device("cpu"))
    trailing = len(items) - next(
        (n for n in range(len(items), 0, -1) if items[n - 1].phase is Phase.DECODE), 0
    )
    tail = plan.prefill_tail
    if trailing == 0:
        assert tail is None
        return
    assert tail is not None and tail.items == trailing
    head = len(items) - trailing
    rows = [i.seq_len if i.phase is Phase.PREFILL else BLOCK for i in items]
    assert tail.start == sum(rows[:head]) and tail.indptr.dtype == torch.int32
    assert tail.indptr.tolist() == [sum(rows[head:n]) for n in range(head, len(items) + 1)]
    before = plan.layout.head(head)
    assert before.num_items == head and int(before.qo_indptr[-1]) == tail.start
    assert len(before.kv_indices) == int(before.kv_indptr[-1]) == sum(map(len, tables[:head]))


class PlannedAttention(TorchAttention):
    """The torch backend, keeping the row counts of the layouts it is planned with."""

    def __init__(self) -> None:
        super().__init__()
        self.planned: list[int] = []

    def plan(self, layout: AttentionLayout) -> None:
        self.planned.append(int(layout.qo_indptr[-1]))
        super().plan(layout)


def runner(model: Transformer, dtype: torch.dtype, own: bool = True) -> ModelRunner:
    """A CPU runner over pages of `dtype`, its prefills over their own K/V (`own`) or read back."""
    cache = PagedKVCache.for_model(PagePool(96), model.config, dtype=dtype, device="cpu")
    return ModelRunner(model, cache, PlannedAttention(), TorchPrefillAttention() if own else None)


def stored(run: ModelRunner, items: list[ForwardItem], layer: int) -> Tensor:
    """The K/V one layer holds at every position of the items' sequences (never a slot unwritten)."""
    kv, table = run.cache.layers[layer], run.cache.page_table
    return torch.cat([x for i in items for x in gather_kv(kv, torch.tensor(table(i.request_id)), i.seq_len)])


ENGINE_PACKING = ((40, Phase.DECODE), (21, Phase.DECODE), (33, Phase.PREFILL), (70, Phase.PREFILL))


@pytest.mark.parametrize("family", list(Family))
def test_a_prefill_tail_over_its_own_kv_equals_attention_over_the_pages(
    family: Family,
) -> None:
    model = random_model(tiny(family), dtype=torch.float32, seed=3, std=0.2)
    own_run = runner(model, torch.float32)
    items, own = run_microbatch(own_run, ENGINE_PACKING)
    rows = BLOCK + model.config.logit_shift
    assert isinstance(own_run.backend, PlannedAttention)  # the pages' backend: the two decodes' rows only
    assert own_run.backend.planned[-1] == 2 * rows
    paged_run = runner(model, torch.float32, own=False)
    _, paged = run_microbatch(paged_run, ENGINE_PACKING)
    assert torch.allclose(own, paged, atol=ATOL)
    for layer in range(model.config.shape.layers):  # the same K/V in the pages
        assert torch.allclose(stored(own_run, items, layer), stored(paged_run, items, layer), atol=ATOL)


@pytest.mark.parametrize("family", list(Family))
def test_over_fp8_pages_a_prefill_attends_over_its_unrounded_kv(
    family: Family,
) -> None:
    model = random_model(tiny(family), dtype=torch.float32, seed=4, std=0.2)
    _, exact = run_microbatch(runner(model, torch.float32), ENGINE_PACKING)
    fp8_run = runner(model, FP8)
    items, own = run_microbatch(fp8_run, ENGINE_PACKING)
    prefills = slice(2, 4)
    assert torch.allclose(own[prefills], exact[prefills], atol=ATOL)  # the prefills: no E4M3 rounding
    assert relative_error(own[:2], exact[:2]) > 0  # the decodes read FP8 pages
    paged_run = runner(model, FP8, own=False)
    _, paged = run_microbatch(paged_run, ENGINE_PACKING)
    assert relative_error(paged[prefills], exact[prefills]) > 100 * relative_error(
        own[prefills], exact[prefills]
    )
    # the pages still receive the K/V: bit for bit in the first layer (later ones see other attention)
    first = stored(fp8_run, items, 0).view(torch.uint8), stored(paged_run, items, 0).view(torch.uint8)
    assert torch.equal(*first) and first[0].any()


@pytest.mark.parametrize("family", list(Family))
def test_a_prefill_before_a_decode_attends_over_its_own_kv_and_logits_keep_item_order(family: Family) -> None:
    model = random_model(tiny(family), dtype=torch.float32, seed=6, std=0.2)
    shapes = ((33, Phase.PREFILL), (40, Phase.DECODE), (70, Phase.PREFILL), (21, Phase.DECODE))
    _, exact = run_microbatch(runner(model, torch.float32, own=False), shapes)
    _, own = run_microbatch(runner(model, FP8), shapes)
    for prefill in (0, 2):  # unrounded K/V wherever the prefill sits, its logits at its own place
        assert torch.allclose(own[prefill], exact[prefill], atol=ATOL)
    for decode in (1, 3):  # over FP8 pages: within E4M3's rounding, and not another item's logits
        assert 0 < relative_error(own[decode], exact[decode]) < 0.25  # measured 0.04-0.11; items differ by 1


def test_the_engine_runner_attends_prefills_over_their_own_kv_over_fp8_pages_only() -> None:
    model = random_model(tiny(Family.LLADA), dtype=torch.float32, seed=1)
    for pages, own in ((FP8, True), (torch.float32, False)):
        cache = PagedKVCache.for_model(PagePool(8), model.config, dtype=pages, device="cpu")
        runner = build_runner(model, cache, cuda_graphs=False)
        assert isinstance(runner, ModelRunner)
        assert isinstance(runner.prefill, TorchPrefillAttention) == own and (runner.prefill is None) != own


def test_prefills_attend_over_their_own_kv_over_fp8_pages_only() -> None:
    config = tiny(Family.DREAM)
    assert isinstance(make_prefill_attention("cpu", config, torch.float32, FP8), TorchPrefillAttention)
    for pages in (torch.float32, torch.bfloat16):
        assert make_prefill_attention("cpu", config, torch.float32, pages) is None


def test_flashinfer_prefill_attention_plans_non_causal_fa2_over_the_rows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: dict[str, object] = {}

    class Wrapper:  # FlashInfer's BatchPrefillWithRaggedKVCacheWrapper, as far as it is used
        def __init__(self, workspace: Tensor, layout: str, backend: str) -> None:
            calls["init"] = (layout, backend)

        def plan(self, qo: Tensor, kv: Tensor, *args: object, **kwargs: object) -> None:
            calls["plan"] = (qo.tolist(), kv.tolist(), args, kwargs)

        def run(self, q: Tensor, k: Tensor, v: Tensor, out: Tensor) -> Tensor:
            calls["run"] = (q, k, v, out)
            return out

    fake = types.SimpleNamespace(BatchPrefillWithRaggedKVCacheWrapper=Wrapper)
    monkeypatch.setattr(flashinfer_backend, "flashinfer_module", lambda: fake)
    monkeypatch.setattr(flashinfer_backend, "shared_workspace", lambda device: torch.empty(1))
    attention = flashinfer_backend.FlashInferPrefillAttention(
        4, 2, 16, dtype=torch.bfloat16, device=torch.device("cpu")
    )
    offsets = torch.tensor([0, 3, 10], dtype=torch.int32)
    attention.plan(offsets)
    qo, kv, args, kwargs = calls["plan"]  # type: ignore[misc]
    assert calls["init"] == ("NHD", "fa2") and qo == kv == [0, 3, 10] and args == (4, 2, 16)
    assert kwargs == {
        "causal": False,
        "q_data_type": torch.bfloat16,
        "kv_data_type": torch.bfloat16,
        "o_data_type": torch.bfloat16,
    }
    q, k = torch.randn(10, 4, 16), torch.randn(10, 2, 16)
    out = torch.empty_like(q)
    attention.run(q, k, k, out)
    assert calls["run"][3] is out  # type: ignore[index]


@given(
    lengths=st.lists(st.integers(0, 300), max_size=6),
    block_m=st.sampled_from([16, 64, 128]),
)
def test_prefill_tiles_cover_every_row_once_inside_its_sequence_longest_first(
    lengths: list[int], block_m: int
) -> None:
    offsets = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)
    tiles = prefill_tiles(offsets, block_m)
    assert tiles.dtype == torch.int32 and tiles.shape[1] == 3
    covered = []
    for first, lo, hi in tiles.tolist():  # an empty sequence has no tile
        assert (lo, hi) in itertools.pairwise(offsets.tolist()) and lo <= first < hi
        assert (first - lo) % block_m == 0
        covered += range(first, min(first + block_m, hi))
    assert sorted(covered) == list(range(sum(lengths)))  # each row in exactly one tile
    spans = [hi - lo for _, lo, hi in tiles.tolist()]
    assert spans == sorted(spans, reverse=True)


def test_prefills_over_fp8_pages_on_cuda_fall_back_where_the_triton_kernel_cannot_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The Triton kernel first; one that cannot compile for the GPU (its tiles' shared memory) gives way to
    FlashInfer, or here, where FlashInfer is not installed, to SDPA. No CUDA call is made on the way."""
    built: list[object] = []

    class Kernel:
        def __init__(self, *heads: int, device: torch.device, dtype: torch.dtype) -> None:
            if fails:
                raise RuntimeError("out of resources: shared memory")
            built.append(heads)

    fake = types.SimpleNamespace(TritonPrefillAttention=Kernel)
    monkeypatch.setattr(
        prefill_attention, "triton_module", lambda name: fake if name == "prefill_kernel" else None
    )
    monkeypatch.setattr(prefill_attention, "flashinfer_available", lambda: False)
    config = tiny(Family.DREAM)
    fails = False
    assert isinstance(make_prefill_attention("cuda", config, torch.bfloat16, FP8), Kernel)
    shape = config.shape
    assert built == [(shape.heads, shape.kv_heads, shape.head_dim)]
    fails = True
    assert isinstance(make_prefill_attention("cuda", config, torch.bfloat16, FP8), TorchPrefillAttention)
    monkeypatch.setattr(prefill_attention, "TRITON_KERNEL", False)
    fails = False
    assert isinstance(make_prefill_attention("cuda", config, torch.bfloat16, FP8), TorchPrefillAttention)
    assert len(built) == 1
