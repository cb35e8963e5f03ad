"""The executor on a CUDA device: full-size random models, mixed microbatches, seeded sampling."""

from __future__ import annotations

import pytest
import torch

from executor.model.attention import TorchAttention
from executor.model.config import Family, full_size, tiny
from executor.model.forward import ModelRunner
from executor.model.kv_cache import PagedKVCache
from executor.model.loading import random_model
from executor.model.microbatch import ForwardItem, Phase
from executor.model.sampler import BlockStep, SamplingParams, unmask
from sangam.hardware import BLOCK, pages_for
from sangam.kv import PagePool

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def prompt_and_masks(vocab_end: int, prompt: int, masks: int, mask_id: int) -> torch.Tensor:
    ids = torch.randint(0, vocab_end, (prompt,), generator=torch.Generator().manual_seed(prompt))
    return torch.cat([ids, torch.full((masks,), mask_id)])


@pytest.mark.parametrize("family", list(Family))
def test_tiny_model_on_gpu_matches_cpu(family: Family) -> None:
    results = []
    for device in ("cpu", "cuda"):
        model = random_model(tiny(family), dtype=torch.float32, device="cpu", seed=1, std=0.2).to(device)
        cache = PagedKVCache.for_model(PagePool(32), model.config, dtype=torch.float32, device=device)
        runner = ModelRunner(model, cache, TorchAttention())
        tokens = prompt_and_masks(200, 40, 64, model.config.mask_id)
        cache.pool.allocate(0, pages_for(len(tokens)))
        results.append(runner.forward([ForwardItem(0, Phase.PREFILL, tokens, 40)]).cpu())
    assert torch.allclose(results[0], results[1], atol=1e-4)


@pytest.mark.parametrize("family", list(Family))
def test_full_size_mixed_microbatch_on_gpu(family: Family) -> None:
    config = full_size(family)
    model = random_model(config, device="cuda", seed=0)
    cache = PagedKVCache.for_model(PagePool(1024), config, dtype=torch.bfloat16, device="cuda")
    runner = ModelRunner(model, cache, TorchAttention())
    seqs = {rid: prompt_and_masks(1000, 795 + 7 * rid, 1024, config.mask_id) for rid in range(4)}
    for rid, tokens in seqs.items():
        cache.pool.allocate(rid, pages_for(len(tokens)))
    for rid in (0, 1):
        runner.forward([ForwardItem(rid, Phase.PREFILL, seqs[rid], 795 + 7 * rid)])
    items = [
        ForwardItem(2, Phase.PREFILL, seqs[2], 795 + 14),
        ForwardItem(0, Phase.DECODE, seqs[0], 795),
        ForwardItem(3, Phase.PREFILL, seqs[3], 795 + 21),
        ForwardItem(1, Phase.DECODE, seqs[1], 795 + 7),
    ]
    together = runner.forward(items)
    alone = torch.cat([runner.forward([item]) for item in items])
    assert together.shape == (4, BLOCK, config.shape.vocab) and together.isfinite().all()
    # bf16 GEMMs over different row counts round differently through 28-32 layers: compare in bulk.
    error = (together.float() - alone.float()).abs().mean() / alone.float().abs().mean()
    assert error < 0.02

    steps = [BlockStep(SamplingParams(temperature=1.0, seed=rid), 0, 1) for rid in range(4)]
    blocks = torch.full((4, BLOCK), config.mask_id, device="cuda")
    first, second = (
        unmask(blocks, together, steps, config.mask_id).tokens,
        unmask(blocks, together, steps, config.mask_id).tokens,
    )
    assert torch.equal(first, second) and ((first != config.mask_id).sum(-1) >= 1).all()
