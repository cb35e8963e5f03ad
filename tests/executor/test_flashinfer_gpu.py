"""FlashInfer attention, fused layers and decode CUDA graphs on a CUDA device (skipped without one)."""

from __future__ import annotations

import copy

import pytest
import torch
from executor_helpers import bits, check_prefill_attention, committed, relative_error, reshaped, small_config
from torch import Tensor

from executor.model import layers
from executor.model.attention import AttentionLayout, TorchAttention
from executor.model.config import Family, ModelConfig
from executor.model.cuda_graphs import DUMMY_PAGES, PADDING_OWNER, GraphedModelRunner
from executor.model.flashinfer_backend import (
    FlashInferAttention,
    FlashInferPrefillAttention,
    flashinfer_available,
    make_backend,
)
from executor.model.forward import ModelRunner, SlotStore
from executor.model.kv_cache import KVSlots, PagedKVCache
from executor.model.loading import random_model
from executor.model.microbatch import ForwardItem, Phase
from executor.model.transformer import Transformer
from sangam.hardware import BLOCK, PAGE, pages_for
from sangam.kv import PagePool

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(not flashinfer_available(), reason="needs flashinfer"),
]

DTYPE = torch.bfloat16
HEAD_DIM = 128  # the head_dim of both full-size models: one FlashInfer JIT module serves every test
TOLERANCE = 1e-2  # mean relative error of bf16 results computed along different paths


def sequence(config: ModelConfig, prompt: int, masks: int, seed: int) -> Tensor:
    ids = torch.randint(0, config.mask_id, (prompt,), generator=torch.Generator().manual_seed(seed))
    return torch.cat([ids, torch.full((masks,), config.mask_id)])


def runner_for(model: Transformer, backend: str, pages: int = 512) -> ModelRunner:
    cache = PagedKVCache.for_model(PagePool(pages), model.config, dtype=DTYPE, device="cuda")
    attention = TorchAttention() if backend == "torch" else make_backend("cuda", model.config, dtype=DTYPE)
    return ModelRunner(model, cache, attention)


# -- the attention backends on one paged KV ----------------------------------------------------------------


@pytest.mark.parametrize(("heads", "kv_heads"), [(8, 8), (8, 2), (28, 4)], ids=["mha", "gqa4", "dream"])
def test_flashinfer_equals_torch_on_mixed_prefill_and_decode_layout(heads: int, kv_heads: int) -> None:
    generator = torch.Generator(device="cuda").manual_seed(heads + kv_heads)
    # prefills (query = whole sequence) and decodes (a 32/33-row block over a longer cache), interleaved
    query_lens = [300, 32, 77, 33, 1000, 32]
    kv_lens = [300, 531, 77, 900, 1000, 1819]
    pages = 512
    order = torch.randperm(pages, generator=torch.Generator().manual_seed(0)).tolist()
    tables, used = [], 0
    for kv_len in kv_lens:
        tables.append(order[used : used + pages_for(kv_len)])
        used += pages_for(kv_len)
    layout = AttentionLayout.build(query_lens, kv_lens, tables)
    kv = torch.randn(pages, 2, PAGE, kv_heads, HEAD_DIM, dtype=DTYPE, device="cuda", generator=generator)
    # q as the model makes it: a strided view into the fused qkv projection
    width = (heads + 2 * kv_heads) * HEAD_DIM
    qkv = torch.randn(sum(query_lens), width, dtype=DTYPE, device="cuda", generator=generator)
    q = qkv[:, : heads * HEAD_DIM].view(-1, heads, HEAD_DIM)

    reference = TorchAttention()
    reference.plan(layout)
    expected = reference.run(q, kv)
    flashinfer = FlashInferAttention(heads, kv_heads, HEAD_DIM, dtype=DTYPE, device="cuda")
    flashinfer.plan(layout)
    actual = flashinfer.run(q, kv)
    assert relative_error(actual, expected) < TOLERANCE
    assert float((actual.float() - expected.float()).abs().max()) < 0.05


@pytest.mark.parametrize(("heads", "kv_heads"), [(8, 8), (8, 2), (28, 4)], ids=["mha", "gqa4", "dream"])
def test_flashinfer_prefill_attention_over_own_rows_equals_sdpa(heads: int, kv_heads: int) -> None:
    flashinfer = FlashInferPrefillAttention(
        heads, kv_heads, HEAD_DIM, dtype=DTYPE, device=torch.device("cuda")
    )
    check_prefill_attention(flashinfer, heads, kv_heads, HEAD_DIM)


def test_make_backend_picks_flashinfer_only_for_half_precision_on_cuda() -> None:
    config = small_config(Family.DREAM)
    assert isinstance(make_backend("cuda", config, dtype=torch.bfloat16), FlashInferAttention)
    assert isinstance(make_backend("cuda", config, dtype=torch.float32), TorchAttention)
    assert isinstance(make_backend("cpu", config, dtype=torch.bfloat16), TorchAttention)


# -- fused layers ------------------------------------------------------------------------------------------


def test_fused_norm_add_norm_mlp_and_rope_equal_the_torch_code() -> None:
    torch.manual_seed(0)
    norm = layers.RMSNorm(3584, 1e-6).to("cuda", DTYPE)
    norm.weight.data.normal_(1.0, 0.1)
    mlp = layers.SwiGLU(512, 1024).to("cuda", DTYPE)
    x = torch.randn(300, 3584, dtype=DTYPE, device="cuda")
    h = torch.randn(300, 512, dtype=DTYPE, device="cuda")
    qkv = torch.randn(300, (28 + 8) * HEAD_DIM, dtype=DTYPE, device="cuda")
    positions = torch.randint(0, 4096, (300,), device="cuda")

    def run() -> list[Tensor]:
        q, k = qkv.clone()[:, : 32 * HEAD_DIM].split([28 * HEAD_DIM, 4 * HEAD_DIM], dim=-1)
        rope = layers.Rotary(positions, HEAD_DIM, 1_000_000.0)
        q, k = rope(q.view(-1, 28, HEAD_DIM), k.view(-1, 4, HEAD_DIM))
        stream = x.flip(0).contiguous()  # a residual stream, updated in place by the fused kernel
        added, summed = norm.add_norm(x.clone(), stream)
        return [norm(x), mlp(h), q, k, added, summed]

    with torch.inference_mode():
        fused = run()
        layers.FUSED_KERNELS = False
        try:
            plain = run()
        finally:
            layers.FUSED_KERNELS = True
    for actual, expected in zip(fused, plain, strict=True):
        assert relative_error(actual, expected) < 5e-3


def test_fused_kv_store_puts_every_row_where_the_index_copy_store_does() -> None:
    torch.manual_seed(0)
    kv_heads, rows, pages = 4, 300, 40
    qkv = torch.randn(rows, (28 + 2 * kv_heads) * HEAD_DIM, dtype=DTYPE, device="cuda")
    k, v = qkv[:, 28 * HEAD_DIM :].view(rows, 2, kv_heads, HEAD_DIM).unbind(1)  # strided, as the model's
    slot = torch.randperm(pages * PAGE, device="cuda")[:rows]
    slots = KVSlots(slot // PAGE, slot % PAGE)
    layer = torch.randn(pages, 2, PAGE, kv_heads, HEAD_DIM, dtype=DTYPE, device="cuda")
    expected = layer.clone()
    expected[slots.pages, 0, slots.offsets] = k
    expected[slots.pages, 1, slots.offsets] = v
    for fused in (True, False):
        stored = layer.clone()
        layers.FUSED_KERNELS = fused
        try:
            SlotStore(slots)(stored, k, v)
        finally:
            layers.FUSED_KERNELS = True
        assert torch.equal(stored, expected), f"fused={fused}"


# -- whole model: FlashInfer against torch ----------------------------------------------------------------


@pytest.mark.parametrize("family", list(Family))
def test_model_with_flashinfer_is_as_accurate_as_with_torch_attention(family: Family) -> None:
    """Mixed prefill and decode items; both bf16 runs against the same model in fp32 (torch attention)."""
    model = random_model(small_config(family), device="cuda", seed=2, std=0.1)
    exact_model = copy.deepcopy(model).float()
    lengths = {1: (300, 64), 2: (795, 1024), 3: (40, 32), 4: (500, 96)}
    tokens = {rid: sequence(model.config, p, m, seed=rid) for rid, (p, m) in lengths.items()}
    block = {1: 300, 2: 795, 3: 40, 4: 532}

    def run(net: Transformer, backend: str) -> Tensor:
        cache = PagedKVCache.for_model(PagePool(512), net.config, dtype=net.dtype, device="cuda")
        attention = (
            TorchAttention() if backend == "torch" else make_backend("cuda", net.config, dtype=net.dtype)
        )
        runner = ModelRunner(net, cache, attention)
        for rid, seq in tokens.items():
            cache.pool.allocate(rid, pages_for(len(seq)))
        for rid in (1, 2):  # decodes follow their block's prefill
            runner.forward([ForwardItem(rid, Phase.PREFILL, tokens[rid], block[rid])])
        items = [
            ForwardItem(3, Phase.PREFILL, tokens[3], block[3]),
            ForwardItem(1, Phase.DECODE, tokens[1], block[1]),
            ForwardItem(4, Phase.PREFILL, tokens[4], block[4]),
            ForwardItem(2, Phase.DECODE, tokens[2], block[2]),
        ]
        return runner.forward(items)

    exact = run(exact_model, "torch")
    assert exact.shape == (4, BLOCK, model.config.shape.vocab)
    torch_error = relative_error(run(model, "torch"), exact)
    flashinfer_error = relative_error(run(model, "flashinfer"), exact)
    assert flashinfer_error < max(1.5 * torch_error, 2e-3) and flashinfer_error < 0.03


# -- decode CUDA graphs ------------------------------------------------------------------------------------


def decode_setup(
    family: Family, requests: int = 12, config: ModelConfig | None = None
) -> tuple[ModelRunner, dict[int, Tensor], dict[int, int]]:
    model = random_model(config or small_config(family), device="cuda", seed=3, std=0.1)
    runner = runner_for(model, "flashinfer")
    tokens, block = {}, {}
    for rid in range(requests):
        tokens[rid] = sequence(model.config, 100 + 37 * rid, 64 + 32 * (rid % 3), seed=rid)
        block[rid] = 100 + 37 * rid
        runner.cache.pool.allocate(rid, pages_for(len(tokens[rid])))
        runner.forward([ForwardItem(rid, Phase.PREFILL, tokens[rid], block[rid])])
    return runner, tokens, block


@pytest.mark.parametrize("family", list(Family))
def test_graphed_decode_equals_eager_decode(family: Family) -> None:
    runner, tokens, block = decode_setup(family)
    graphed = GraphedModelRunner(runner, buckets=(1, 2, 4, 8))
    assert graphed.captured
    for n in (1, 2, 3, 5, 8):  # 3 and 5 are padded to 4 and 8
        items = [ForwardItem(rid, Phase.DECODE, tokens[rid], block[rid]) for rid in range(n)]
        assert graphed.bucket_for(items) == next(b for b in (1, 2, 4, 8) if b >= n)
        eager = runner.forward(items)
        replayed = graphed.forward(items)
        assert replayed.shape == eager.shape == (n, BLOCK, runner.model.config.shape.vocab)
        assert relative_error(replayed, eager) < TOLERANCE, n
        again = graphed.forward(items)  # a replay is deterministic and its result is the caller's copy
        assert torch.equal(again, replayed)
        step = [committed(item, seed=n) for item in items]  # the block's next step: only tokens change
        assert relative_error(graphed.forward(step), runner.forward(step)) < TOLERANCE, n
    # more items than the largest bucket, or a prefill among them: eager, same results
    items = [ForwardItem(rid, Phase.DECODE, tokens[rid], block[rid]) for rid in range(10)]
    assert graphed.bucket_for(items) is None
    assert relative_error(graphed.forward(items), runner.forward(items)) < TOLERANCE
    mixed = [ForwardItem(0, Phase.PREFILL, tokens[0], block[0]), *items[1:3]]
    assert graphed.bucket_for(mixed) is None
    assert graphed.forward(mixed).shape == (3, BLOCK, runner.model.config.shape.vocab)
    # turned off: everything eager
    off = GraphedModelRunner(runner, enabled=False)
    assert off.bucket_for(items[:2]) is None and not off.captured
    graphed.close()


@pytest.mark.parametrize("family", list(Family))
def test_exact_grid_buckets_replay_every_composition_and_step_like_eager(family: Family) -> None:
    # the full-size models' attention geometry on a narrow body; the sub-items are those of an H200
    heads, kv_heads = (32, 32) if family is Family.LLADA else (28, 4)
    config = reshaped(small_config(family), heads=heads, kv_heads=kv_heads)
    runner, tokens, block = decode_setup(family, config=config)
    graphed = GraphedModelRunner(runner, buckets=(2, 4, 8))
    assert graphed.captured and graphed._multiprocessors == 132
    parts = {size: graphed.item_rows(size) if graphed.exact_grid(size) else None for size in (2, 4, 8)}
    if family is Family.LLADA:
        assert parts == {2: [16, 16], 4: [16, 16], 8: [32]}
    else:
        assert parts == {2: None, 4: None, 8: [9, 9, 9, 6]}
    for rids in ((0, 1, 2), (3, 4, 5, 6), (0, 1, 2), (7, 8, 9, 10, 11), (1, 3, 5, 7, 9, 11, 0, 2)):
        items = [ForwardItem(rid, Phase.DECODE, tokens[rid], block[rid]) for rid in rids]
        for step in range(3):  # a block's consecutive steps: same composition, new tokens
            replayed, eager = graphed.forward(items), runner.forward(items)
            # bf16 attention, unsplit against split KV: about 1% apart; a stale plan is O(1)
            assert relative_error(replayed, eager) < 2 * TOLERANCE, (rids, step)
            items = [committed(item, seed=step) for item in items]
    graphed.close()


@pytest.mark.parametrize("exact", [False, True], ids=["graph-mode", "exact-grid"])
def test_replans_into_a_captured_run_equal_fresh_plans(exact: bool) -> None:
    heads, kv_heads, batch, rows = (32, 32, 4, 32) if exact else (28, 4, 4, 33)
    per_item = 8
    kv = torch.randn(batch * per_item * 3, 2, PAGE, kv_heads, HEAD_DIM, dtype=DTYPE, device="cuda")
    generator = torch.Generator().manual_seed(5)
    layouts = []
    for lens in ([120, 97, 128, 64], [33, 128, 80, 111], [128, 128, 1, 50]):
        pages = torch.randperm(len(kv), generator=generator).tolist()
        tables = [pages[i * per_item : (i + 1) * per_item] for i in range(batch)]
        layouts.append(AttentionLayout.build([rows] * batch, lens, tables))
    q = torch.randn(batch * rows, heads, HEAD_DIM, dtype=DTYPE, device="cuda")
    backend = FlashInferAttention(
        heads, kv_heads, HEAD_DIM, dtype=DTYPE, cuda_graph_batch=batch, max_pages=len(kv), exact_grid=exact
    )
    backend.plan(layouts[0])
    backend.run(q, kv)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = backend.run(q, kv)
    for layout in (*layouts[1:], layouts[0]):
        backend.plan(layout)
        graph.replay()
        eager = FlashInferAttention(heads, kv_heads, HEAD_DIM, dtype=DTYPE)
        eager.plan(layout)
        assert relative_error(out, eager.run(q, kv)) < TOLERANCE
        if not exact:  # a fresh graph-mode wrapper planned by FlashInfer itself: the very same result
            fresh = FlashInferAttention(
                heads, kv_heads, HEAD_DIM, dtype=DTYPE, cuda_graph_batch=batch, max_pages=len(kv)
            )
            fresh.plan(layout)
            assert torch.equal(out, fresh.run(q, kv))


def test_graph_padding_pages_are_reserved_once_and_never_touch_real_pages() -> None:
    runner, tokens, block = decode_setup(Family.DREAM, requests=6)
    pool = runner.cache.pool
    used = pool.num_used
    graphed = GraphedModelRunner(runner, buckets=(2, 4, 8))
    assert pool.num_used == used + DUMMY_PAGES
    assert pool.pages_of(PADDING_OWNER) == graphed.dummy_pages
    real = {page for rid in tokens for page in pool.pages_of(rid)}
    assert not real & set(graphed.dummy_pages)

    untouched = [page for rid in (3, 4, 5) for page in pool.pages_of(rid)]
    before = [layer[untouched].clone() for layer in runner.cache.layers]
    items = [ForwardItem(rid, Phase.DECODE, tokens[rid], block[rid]) for rid in range(3)]
    for _ in range(3):  # 3 items in a bucket of 4: one padding item per replay
        graphed.forward(items)
    for layer, saved in zip(runner.cache.layers, before, strict=True):
        assert torch.equal(bits(layer[untouched]), bits(saved))
    assert pool.num_used == used + DUMMY_PAGES  # replays allocate nothing

    pool.release(5)  # requests come and go around the reserved pages
    pool.allocate(6, pages_for(len(tokens[5])))
    assert pool.num_used == used + DUMMY_PAGES
    graphed.close()
    assert pool.num_used == used and not pool.holds(PADDING_OWNER)
