"""Paged KV storage on sangam's PagePool, the CSR attention layout and the torch attention backend."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from executor.model.attention import AttentionLayout, TorchAttention
from executor.model.kv_cache import KVSlots, PagedKVCache
from sangam.hardware import PAGE, pages_for
from sangam.kv import PagePool

KV_HEADS, HEAD_DIM = 2, 8


def make_cache(pages: int, layers: int = 2) -> PagedKVCache:
    return PagedKVCache(PagePool(pages), layers, KV_HEADS, HEAD_DIM, dtype=torch.float32, device="cpu")


def random_kv(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(n, KV_HEADS, HEAD_DIM, generator=generator) for _ in range(2))  # type: ignore[return-value]


def test_cache_takes_its_pages_from_the_pool() -> None:
    cache = make_cache(pages=10)
    pages = cache.pool.allocate(5, pages_for(40))
    assert cache.page_table(5) == pages
    assert len(pages) == 3 and cache.pool.num_free == 7
    assert cache.layers[0].shape == (11, 2, PAGE, KV_HEADS, HEAD_DIM)  # the pool's 10 and the scratch page
    assert cache.scratch_page == 10
    assert all(cache.scratch_page not in cache.pool.allocate(rid, 1) for rid in range(6, 13))


def test_write_then_gather_round_trips_across_pages() -> None:
    cache = make_cache(pages=8)
    cache.pool.allocate(0, 1)  # so request 1's pages are neither first nor contiguous from zero
    cache.pool.allocate(1, pages_for(37))
    k, v = random_kv(37, seed=0)
    cache.write(1, KVSlots.of(cache.page_table(1), torch.arange(37)), k, v)
    got_k, got_v = cache.gather(1, 1, 37)
    assert torch.equal(got_k, k) and torch.equal(got_v, v)


def test_overwriting_a_block_leaves_other_positions_alone() -> None:
    cache = make_cache(pages=8)
    cache.pool.allocate(3, pages_for(64))
    k, v = random_kv(64, seed=1)
    cache.write(0, KVSlots.of(cache.page_table(3), torch.arange(64)), k, v)
    new_k, new_v = random_kv(32, seed=2)
    cache.write(0, KVSlots.of(cache.page_table(3), torch.arange(20, 52)), new_k, new_v)
    got_k, got_v = cache.gather(0, 3, 64)
    assert torch.equal(got_k[20:52], new_k) and torch.equal(got_v[20:52], new_v)
    assert torch.equal(got_k[:20], k[:20]) and torch.equal(got_k[52:], k[52:])


def test_release_returns_pages_for_the_next_request() -> None:
    cache = make_cache(pages=4)
    first = cache.pool.allocate(1, 4)
    assert not cache.pool.can_allocate(1)
    assert cache.pool.release(1) == 4
    assert sorted(cache.pool.allocate(2, 4)) == sorted(first)


def test_layout_is_flashinfer_csr() -> None:
    layout = AttentionLayout.build([33, 70], [70, 32], [[7, 3, 5, 1, 9], [4, 2, 8]])
    assert layout.qo_indptr.tolist() == [0, 33, 103]
    assert layout.kv_indptr.tolist() == [0, 5, 7]
    assert layout.kv_indices.tolist() == [7, 3, 5, 1, 9, 4, 2]
    assert layout.kv_last_page_len.tolist() == [6, 16]
    assert layout.kv_lens == [70, 32]
    assert layout.qo_indptr.dtype == torch.int32


def test_torch_backend_equals_sdpa_over_each_item() -> None:
    cache = make_cache(pages=16, layers=1)
    kv_lens, query_lens, heads = [50, 29], [50, 9], 4
    generator = torch.Generator().manual_seed(3)
    keys, values = [], []
    for rid, n in enumerate(kv_lens):
        cache.pool.allocate(rid, pages_for(n))
        k, v = random_kv(n, seed=10 + rid)
        cache.write(0, KVSlots.of(cache.page_table(rid), torch.arange(n)), k, v)
        keys.append(k)
        values.append(v)
    q = torch.randn(sum(query_lens), heads, HEAD_DIM, generator=generator)
    backend = TorchAttention()
    backend.plan(AttentionLayout.build(query_lens, kv_lens, [cache.page_table(r) for r in range(2)]))
    out = backend.run(q, cache.layers[0])
    for rows, k, v in zip([slice(0, 50), slice(50, 59)], keys, values, strict=True):
        repeat = heads // KV_HEADS
        expected = F.scaled_dot_product_attention(
            q[rows].transpose(0, 1),
            k.repeat_interleave(repeat, 1).transpose(0, 1),
            v.repeat_interleave(repeat, 1).transpose(0, 1),
        ).transpose(0, 1)
        assert torch.allclose(out[rows], expected, atol=1e-6)
