"""The padded static decode path of `GraphedModelRunner` on CPU (`capture=False`): layouts and results."""

from __future__ import annotations

import itertools
from dataclasses import astuple

import pytest
import torch
from executor_helpers import committed
from torch import Tensor

from executor.model.attention import AttentionLayout, TorchAttention, same_layout
from executor.model.config import Family, tiny
from executor.model.cuda_graphs import (
    DEFAULT_BUCKETS,
    TILE_ROWS,
    GraphedModelRunner,
    subitem_rows,
    unsplit_subitems,
)
from executor.model.forward import ModelRunner
from executor.model.kv_cache import PagedKVCache
from executor.model.loading import random_model
from executor.model.microbatch import ForwardItem, Phase
from sangam.hardware import pages_for
from sangam.kv import PagePool

BUCKETS = (1, 2, 4, 8)


def decoding_runner(family: Family, requests: int) -> tuple[ModelRunner, list[ForwardItem]]:
    """A tiny fp32 model with `requests` prefilled sequences and the decode item of each one's block."""
    model = random_model(tiny(family), dtype=torch.float32, seed=1, std=0.1)
    cache = PagedKVCache.for_model(PagePool(96), model.config, dtype=torch.float32, device="cpu")
    runner = ModelRunner(model, cache, TorchAttention())
    decodes = []
    for rid in range(requests):
        prompt = 40 + 23 * rid
        ids = torch.randint(0, model.config.mask_id, (prompt,), generator=torch.Generator().manual_seed(rid))
        tokens: Tensor = torch.cat([ids, torch.full((64,), model.config.mask_id)])
        cache.pool.allocate(rid, pages_for(len(tokens)))
        runner.forward([ForwardItem(rid, Phase.PREFILL, tokens, prompt)])
        decodes.append(ForwardItem(rid, Phase.DECODE, tokens, prompt))
    return runner, decodes


@pytest.mark.parametrize("family", list(Family))
def test_padded_static_decode_equals_eager_decode(family: Family) -> None:
    runner, decodes = decoding_runner(family, requests=6)
    graphed = GraphedModelRunner(runner, buckets=BUCKETS, capture=False)
    assert not graphed.captured
    for n in (1, 3, 4, 6):  # 3 and 6 run in buckets 4 and 8 with padding items
        items = decodes[:n]
        assert graphed.bucket_for(items) == next(b for b in BUCKETS if b >= n)
        torch.testing.assert_close(graphed.forward(items), runner.forward(items), rtol=1e-4, atol=1e-5)
        # the block's next step: same composition, some masks committed; only the tokens are copied again
        step = [committed(item, seed=n) for item in items]
        assert graphed._buckets[graphed.bucket_for(step) or 0].last is not None
        torch.testing.assert_close(graphed.forward(step), runner.forward(step), rtol=1e-4, atol=1e-5)
    graphed.close()


def test_mha_buckets_carry_empty_entries_that_bring_the_row_bound_to_one_tile() -> None:
    runner, decodes = decoding_runner(Family.LLADA, requests=3)
    graphed = GraphedModelRunner(runner, buckets=BUCKETS, capture=False)
    for size in BUCKETS:
        layout = graphed._buckets[size].plan.layout
        rows = layout.qo_indptr.tolist()
        entries = graphed.tile_entries(size)
        assert layout.num_items == size + entries
        assert rows[-1] == size * graphed.rows and rows[size:] == [rows[size]] * (entries + 1)
        assert rows[-1] - layout.num_items + 1 <= TILE_ROWS  # FlashInfer's graph-mode bound: a 64-row tile
        assert entries == (0 if size <= 2 else size * 32 - size + 1 - TILE_ROWS)
    # a replay's layout keeps the same entries behind the real and padding items
    with torch.inference_mode():
        replay = graphed._pack(decodes[:3], graphed._buckets[4])
    assert replay.num_items == 4 + graphed.tile_entries(4)
    assert replay.kv_lens[:3] == [item.seq_len for item in decodes[:3]]
    assert replay.kv_lens[4:] == [1] * graphed.tile_entries(4)
    graphed.close()


def test_gqa_whose_packed_block_exceeds_the_tile_gets_no_entries() -> None:
    runner, _ = decoding_runner(Family.DREAM, requests=1)
    graphed = GraphedModelRunner(runner, buckets=BUCKETS, capture=False)
    # tiny Dream: 2 query heads per KV head, 33 rows per item: 66 packed rows never fit a 64-row tile
    assert graphed.group == 2 and all(graphed.tile_entries(size) == 0 for size in BUCKETS)
    graphed.close()


def test_unsplit_grids_take_the_fewest_sub_items_that_fill_an_h200() -> None:
    def parts(rows: int, group: int, kv_heads: int) -> dict[int, int | None]:
        return {b: unsplit_subitems(b, rows, group, kv_heads, 132) for b in DEFAULT_BUCKETS}

    # LLaDA-8B: 32 rows, MHA. 2 x 16 rows fill 132 multiprocessors once at 2 items, twice at 4; whole items
    # twice from 8; 4 x 8 rows would leave half of each 16-row tile empty.
    assert parts(32, 1, 32) == {1: None, 2: 2, 4: 2, 8: 1, 16: 1, 32: 1, 64: 1}
    # Dream-7B: 33 rows times 7 query heads over 4 KV heads; 4 sub-items of 9 rows fit a 64-row tile.
    assert parts(33, 7, 4) == {1: None, 2: None, 4: None, 8: 4, 16: 4, 32: 1, 64: 1}
    assert (
        subitem_rows(33, 4) == [9, 9, 9, 6]
        and subitem_rows(32, 2) == [16, 16]
        and subitem_rows(5, 4) == [2, 2, 1]
    )


@pytest.mark.parametrize("family", list(Family))
def test_sub_item_buckets_attend_each_part_to_its_items_whole_kv_like_eager(
    family: Family, monkeypatch: pytest.MonkeyPatch
) -> None:
    # unsplit grids exist only with FlashInfer on a GPU: force 2 sub-items from bucket 4 to test their layouts
    monkeypatch.setattr(GraphedModelRunner, "_subitems", lambda self, size: 2 if size >= 4 else None)
    runner, decodes = decoding_runner(family, requests=6)
    graphed = GraphedModelRunner(runner, buckets=BUCKETS, capture=False)
    rows = graphed.rows
    assert graphed.item_rows(2) == [rows] and graphed.item_rows(4) == subitem_rows(rows, 2)
    with torch.inference_mode():
        layout = graphed._pack(decodes[:3], graphed._buckets[4])
    assert layout.num_items == 8 and layout.qo_indptr[-1] == 4 * rows
    assert layout.kv_lens[:6] == [item.seq_len for item in decodes[:3] for _ in range(2)]
    bounds = layout.kv_indptr.tolist()
    tables = [layout.kv_indices[a:b].tolist() for a, b in itertools.pairwise(bounds)]
    assert tables[0] == tables[1] == runner.cache.page_table(0)[: len(tables[0])]
    for n in (3, 4, 6):
        items = decodes[:n]
        torch.testing.assert_close(graphed.forward(items), runner.forward(items), rtol=1e-4, atol=1e-5)
    graphed.close()


def test_a_blocks_next_step_keeps_its_layout_and_another_composition_gets_its_own() -> None:
    runner, decodes = decoding_runner(Family.LLADA, requests=4)
    graphed = GraphedModelRunner(runner, buckets=BUCKETS, capture=False)
    bucket = graphed._buckets[4]
    with torch.inference_mode():
        first = graphed._pack(decodes[:3], bucket)
        step = graphed._pack([committed(item, seed=1) for item in decodes[:3]], bucket)
        other = graphed._pack([decodes[0], decodes[1], decodes[3]], bucket)
    assert step is first  # FlashInferAttention.plan then skips: same layout
    assert not same_layout(other, first) and same_layout(other, AttentionLayout(*astuple(other)))
    graphed.close()
