"""The paged, packed microbatch forward against the dense reference and against itself item by item."""

from __future__ import annotations

import pytest
import torch
from executor_helpers import bits, dense_block_logits, reshaped
from torch import Tensor

from executor.model.attention import TorchAttention
from executor.model.config import Family, ModelConfig, tiny
from executor.model.forward import ModelRunner
from executor.model.kv_cache import PagedKVCache
from executor.model.loading import random_model
from executor.model.microbatch import ForwardItem, Phase
from executor.model.sampler import BlockStep, SamplingParams, block_done, unmask
from executor.model.transformer import Transformer
from sangam.hardware import BLOCK, pages_for
from sangam.kv import PagePool

ATOL = 2e-5


def make_runner(model: Transformer, pages: int = 64) -> ModelRunner:
    cache = PagedKVCache.for_model(PagePool(pages), model.config, dtype=torch.float32, device="cpu")
    return ModelRunner(model, cache, TorchAttention())


def sequence(config: ModelConfig, prompt: int, masks: int, seed: int) -> Tensor:
    """A prompt of random tokens (never the mask id) followed by `masks` mask tokens."""
    ids = torch.randint(0, config.mask_id, (prompt,), generator=torch.Generator().manual_seed(seed))
    return torch.cat([ids, torch.full((masks,), config.mask_id)])


def admit(runner: ModelRunner, request_id: int, tokens: Tensor) -> None:
    runner.cache.pool.allocate(request_id, pages_for(len(tokens)))


def commit_some(tokens: Tensor, block_start: int, seed: int) -> Tensor:
    """The sequence with half the block's masks replaced by random tokens, as a denoising step would."""
    changed = tokens.clone()
    generator = torch.Generator().manual_seed(seed)
    picks = torch.randperm(BLOCK, generator=generator)[: BLOCK // 2] + block_start
    changed[picks] = torch.randint(0, 200, (len(picks),), generator=generator)
    return changed


@pytest.mark.parametrize("family", list(Family))
def test_prefill_equals_dense_forward(family: Family) -> None:
    model = random_model(tiny(family), dtype=torch.float32, seed=3, std=0.2)
    runner = make_runner(model)
    tokens = sequence(model.config, prompt=37, masks=64, seed=4)
    admit(runner, 7, tokens)
    for block_start in (37, 69):
        logits = runner.forward([ForwardItem(7, Phase.PREFILL, tokens, block_start)])
        assert logits.shape == (1, BLOCK, model.config.shape.vocab)
        assert torch.allclose(logits[0], dense_block_logits(model, tokens, block_start), atol=ATOL)


@pytest.mark.parametrize("family", list(Family))
def test_decode_of_unchanged_block_repeats_the_prefill(family: Family) -> None:
    model = random_model(tiny(family), dtype=torch.float32, seed=5, std=0.2)
    runner = make_runner(model)
    tokens = sequence(model.config, prompt=21, masks=96, seed=6)
    admit(runner, 1, tokens)
    prefill = runner.forward([ForwardItem(1, Phase.PREFILL, tokens, 53)])
    decode = runner.forward([ForwardItem(1, Phase.DECODE, tokens, 53)])
    assert torch.allclose(decode, prefill, atol=ATOL)


@pytest.mark.parametrize("family", list(Family))
def test_one_layer_decode_equals_dense_forward_of_new_tokens(family: Family) -> None:
    # With one layer, cached K/V depend on each position's own token only, so the dual cache is exact:
    # a decode after the block changed must equal a dense forward of the changed sequence.
    config = reshaped(tiny(family), layers=1)
    model = random_model(config, dtype=torch.float32, seed=7, std=0.2)
    runner = make_runner(model)
    tokens = sequence(config, prompt=30, masks=64, seed=8)
    admit(runner, 2, tokens)
    runner.forward([ForwardItem(2, Phase.PREFILL, tokens, 30)])
    changed = commit_some(tokens, 30, seed=9)
    decode = runner.forward([ForwardItem(2, Phase.DECODE, changed, 30)])
    assert torch.allclose(decode[0], dense_block_logits(model, changed, 30), atol=ATOL)
    assert not torch.allclose(decode[0], dense_block_logits(model, tokens, 30), atol=ATOL)


@pytest.mark.parametrize("family", list(Family))
def test_a_decode_keeps_the_kv_of_its_block_only(family: Family) -> None:
    # Dream's decode also forwards the row left of its block; that row's K/V go to the scratch page.
    model = random_model(tiny(family), dtype=torch.float32, seed=12, std=0.2)
    runner = make_runner(model)
    tokens = sequence(model.config, prompt=40, masks=64, seed=13)
    admit(runner, 3, tokens)
    runner.forward([ForwardItem(3, Phase.PREFILL, tokens, 40)])
    cache = runner.cache
    pages = cache.page_table(3)
    before = [layer.clone() for layer in cache.layers]
    runner.forward([ForwardItem(3, Phase.DECODE, commit_some(tokens, 40, seed=14), 40)])
    block = torch.zeros(len(tokens), dtype=torch.bool)
    block[40 : 40 + BLOCK] = True
    for layer, (old, new) in enumerate(zip(before, cache.layers, strict=True)):
        stored = [bits(kv[pages]).transpose(0, 1).flatten(1, 2) for kv in (old, new)]  # (2, positions, ...)
        changed = (stored[0] != stored[1]).flatten(2).any(-1).any(0)[: len(tokens)]
        assert not changed[~block].any() and changed[block].any(), f"layer {layer}"
        scratch = cache.scratch_page
        assert torch.equal(bits(old[scratch]), bits(new[scratch])) == (model.config.logit_shift == 0)


@pytest.mark.parametrize("family", list(Family))
def test_mixed_microbatch_equals_items_alone(family: Family) -> None:
    model = random_model(tiny(family), dtype=torch.float32, seed=10, std=0.2)
    lengths = {1: (19, 64), 2: (44, 96), 3: (5, 32), 4: (70, 64)}
    tokens = {rid: sequence(model.config, p, m, seed=rid) for rid, (p, m) in lengths.items()}
    block = {1: 19, 2: 44 + 32, 3: 5, 4: 70}
    runners = make_runner(model), make_runner(model)
    for runner in runners:
        for rid in tokens:
            admit(runner, rid, tokens[rid])
        for rid in (1, 2):  # the decodes' blocks were prefilled earlier, then partly committed
            runner.forward([ForwardItem(rid, Phase.PREFILL, tokens[rid], block[rid])])
    decoded = {rid: commit_some(tokens[rid], block[rid], seed=rid + 20) for rid in (1, 2)}
    items = [
        ForwardItem(3, Phase.PREFILL, tokens[3], block[3]),
        ForwardItem(1, Phase.DECODE, decoded[1], block[1]),
        ForwardItem(4, Phase.PREFILL, tokens[4], block[4]),
        ForwardItem(2, Phase.DECODE, decoded[2], block[2]),
    ]
    mixed, single = runners
    together = mixed.forward(items)
    alone = torch.cat([single.forward([item]) for item in items])
    assert torch.allclose(together, alone, atol=ATOL)


@pytest.mark.parametrize("family", list(Family))
@pytest.mark.parametrize("forwards", [1, 5, 32])
def test_scheduled_block_runs_prefill_then_decodes_to_completion(family: Family, forwards: int) -> None:
    model = random_model(tiny(family), dtype=torch.float32, seed=11)
    runner = make_runner(model)
    tokens = sequence(model.config, prompt=12, masks=64, seed=12)
    admit(runner, 9, tokens)
    params, phase, step = SamplingParams(seed=9), Phase.PREFILL, 0
    while not block_done(tokens[12 : 12 + BLOCK], model.config.mask_id):
        logits = runner.forward([ForwardItem(9, phase, tokens, 12)])
        block = unmask(
            tokens[None, 12 : 12 + BLOCK],
            logits,
            [BlockStep(params, 0, step, forwards)],
            model.config.mask_id,
        ).tokens
        tokens = torch.cat([tokens[:12], block[0], tokens[12 + BLOCK :]])
        phase, step = Phase.DECODE, step + 1
    assert step == forwards
    assert (tokens[12 + BLOCK :] == model.config.mask_id).all()
