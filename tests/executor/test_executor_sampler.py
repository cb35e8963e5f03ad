"""Confidence-threshold and scheduled unmasking, seeded Gumbel sampling and the EOS rules."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor

from executor.model.sampler import (
    BlockStep,
    SamplingParams,
    before_eos,
    block_done,
    commits_eos,
    ends_generation,
    log_probs,
    propose,
    schedule_quota,
    step_seed,
    unmask,
)
from sangam.hardware import BLOCK

VOCAB, MASK, EOS = 50, 49, 48


def peaked(tokens: list[int], probs: list[float]) -> Tensor:
    """Logits (32, VOCAB) whose row i puts probability probs[i] on tokens[i], the rest spread evenly."""
    logits = torch.empty(BLOCK, VOCAB)
    for i, (token, prob) in enumerate(zip(tokens, probs, strict=True)):
        rest = (1.0 - prob) / (VOCAB - 1)
        row = torch.full((VOCAB,), rest)
        row[token] = prob
        logits[i] = row.log()
    return logits


def unmask_block(block: Tensor, logits: Tensor, block_step: BlockStep, mask_id: int) -> Tensor:
    """`unmask` of a batch of one."""
    return unmask(block[None], logits[None], [block_step], mask_id).tokens[0]


def propose_one(logits: Tensor, temperature: float = 0.0, seed: int = 0) -> tuple[Tensor, Tensor]:
    batch = logits[None]
    proposal, confidence = propose(
        batch, MASK, [step(temperature=temperature, seed=seed)], log_probs(batch, MASK)
    )
    return proposal[0], confidence[0]


def masks() -> Tensor:
    return torch.full((BLOCK,), MASK)


def step(step_index: int = 0, *, forwards: int | None = None, **params: float) -> BlockStep:
    return BlockStep(SamplingParams(**params), block=0, step=step_index, forwards=forwards)  # type: ignore[arg-type]


def test_commits_every_position_at_or_above_the_threshold() -> None:
    probs = [0.5] * BLOCK
    # a softmax does not land exactly on 0.9 on every CPU (it gave 0.8999999 here): a hair either side
    probs[3], probs[17], probs[30] = 0.95, 0.90001, 0.89999
    out = unmask_block(masks(), peaked(list(range(BLOCK)), probs), step(), MASK)
    assert (out != MASK).nonzero().flatten().tolist() == [3, 17]
    assert out[3] == 3 and out[17] == 17


def test_commits_the_most_confident_when_none_reaches_the_threshold() -> None:
    probs = [0.1] * BLOCK
    probs[11] = 0.4
    out = unmask_block(masks(), peaked([5] * BLOCK, probs), step(), MASK)
    assert (out != MASK).nonzero().flatten().tolist() == [11]
    assert out[11] == 5


def test_only_masked_positions_change() -> None:
    block = masks()
    block[:10] = 7
    probs = [0.99] * BLOCK
    probs[20] = 0.3
    out = unmask_block(block, peaked([2] * BLOCK, probs), step(), MASK)
    assert (out[:10] == 7).all()
    assert (out[10:] == 2).sum() == BLOCK - 11 and out[20] == MASK


def test_argmax_proposals_and_the_mask_id_is_never_proposed() -> None:
    logits = torch.randn(BLOCK, VOCAB, generator=torch.Generator().manual_seed(0))
    logits[:, MASK] = 100.0
    proposal, confidence = propose_one(logits)
    without_mask = logits.clone()
    without_mask[:, MASK] = -torch.inf
    assert torch.equal(proposal, without_mask.argmax(-1))
    assert (confidence < 1e-30).all()  # confidence is the raw softmax, where the mask took all the mass


def test_bf16_logits_are_scored_in_float32() -> None:
    logits = (3 * torch.randn(2, BLOCK, VOCAB, generator=torch.Generator().manual_seed(1))).bfloat16()
    expected = torch.log_softmax(logits.float(), dim=-1)
    expected[..., MASK] = -torch.inf
    assert torch.equal(log_probs(logits, MASK), expected)  # float32 from the bf16 values, not bf16 rounding


def test_gumbel_sampling_is_reproducible_per_seed_block_and_step() -> None:
    flat = torch.zeros(BLOCK, VOCAB)
    hot = step(2, temperature=1.0, seed=42)
    first = unmask_block(masks(), flat, hot, MASK)
    assert torch.equal(first, unmask_block(masks(), flat, hot, MASK))
    other = unmask_block(masks(), flat, step(3, temperature=1.0, seed=42), MASK)
    proposal = lambda s: propose_one(flat, 1.0, seed=s)[0]  # noqa: E731
    assert not torch.equal(proposal(1), proposal(2))
    assert first.ne(MASK).sum() == 1 and other.ne(MASK).sum() == 1


@pytest.mark.parametrize("temperature", [0.7, 1.0, 1.5])
def test_gumbel_noise_and_scores_are_float64(temperature: float) -> None:
    """The proposal is argmax(logits + T * g) with g = -log(-log u), u uniform in float64 from the step's
    generator, everything in float64 (LLaDA's sampler: low precision hurts quality)."""
    logits = torch.randn(BLOCK, VOCAB, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    for seed in range(8):
        proposal, _ = propose_one(logits, temperature, seed=seed)
        generator = torch.Generator().manual_seed(step_seed(seed, 0, 0))
        uniform = torch.rand(BLOCK, VOCAB, generator=generator, dtype=torch.float64)
        scores = logits.double() - temperature * torch.log(-torch.log(uniform))
        scores[:, MASK] = -torch.inf
        assert torch.equal(proposal, scores.argmax(-1))


def test_dreams_refresh_commits_the_first_position_whatever_the_confidence() -> None:
    """Dream's first forward of a block commits its first position alone: a confident position elsewhere
    waits, and an unsure first position is still taken. Later forwards and schedule mode keep their rules."""
    probs = [0.99] * BLOCK
    probs[0] = 0.2
    logits = peaked(list(range(BLOCK)), probs)
    first = unmask(masks()[None], logits[None], [step(0)], MASK, first_at_refresh=True).tokens[0]
    expected = masks()
    expected[0] = int(logits[0].argmax())  # a straightforward statement of the rule
    assert torch.equal(first, expected)
    later = unmask(masks()[None], logits[None], [step(1)], MASK, first_at_refresh=True).tokens[0]
    assert torch.equal(later, unmask_block(masks(), logits, step(1), MASK))
    scheduled = unmask(
        masks()[None], logits[None], [step(0, forwards=1)], MASK, first_at_refresh=True
    ).tokens[0]
    assert scheduled.ne(MASK).all()
    assert unmask_block(masks(), logits, step(0), MASK).ne(MASK).sum() == BLOCK - 1  # LLaDA's rule


@pytest.mark.parametrize("temperature", [1e-4, 1e-44])  # 1e-44: l / T is -inf everywhere in float32
def test_gumbel_at_low_temperature_is_argmax(temperature: float) -> None:
    logits = torch.randn(BLOCK, VOCAB, generator=torch.Generator().manual_seed(1)) * 5
    cold, _ = propose_one(logits, temperature)
    greedy, _ = propose_one(logits)
    assert torch.equal(cold, greedy) and greedy.ne(0).any()


def test_eos_ends_generation_once_its_block_is_done() -> None:
    block = torch.arange(BLOCK)
    assert block_done(block, MASK) and not commits_eos(block, [EOS])
    block[5] = EOS
    assert ends_generation(block, MASK, [EOS])
    block[9] = MASK
    assert commits_eos(block, [EOS]) and not ends_generation(block, MASK, [EOS])
    assert before_eos(torch.tensor([4, 5, EOS, 6, EOS]), [EOS]).tolist() == [4, 5]
    assert before_eos(torch.tensor([4, 5]), [EOS]).tolist() == [4, 5]


def run_block(forwards: int | None, seed: int) -> int:
    """Forwards a block takes on random logits (never confident), each step seeing fresh logits."""
    block, generator, taken = masks(), torch.Generator().manual_seed(seed), 0
    while not block_done(block, MASK):
        logits = torch.randn(BLOCK, VOCAB, generator=generator)
        block = unmask_block(block, logits, step(taken, forwards=forwards), MASK)
        taken += 1
    return taken


@pytest.mark.parametrize("forwards", [1, 2, 3, 4, 7, 10, 16, 25, 31, 32])
def test_schedule_finishes_in_exactly_d_forwards(forwards: int) -> None:
    assert run_block(forwards, seed=forwards) == forwards


def test_random_logits_under_the_threshold_take_32_forwards() -> None:
    assert run_block(None, seed=0) == BLOCK


def test_schedule_commits_the_most_confident() -> None:
    probs = [0.2] * BLOCK
    probs[4], probs[8] = 0.5, 0.6
    out = unmask_block(masks(), peaked([1] * BLOCK, probs), step(0, forwards=16), MASK)
    assert (out != MASK).nonzero().flatten().tolist() == [4, 8]


def test_schedule_rejects_steps_past_its_end() -> None:
    with pytest.raises(ValueError):
        unmask_block(masks(), torch.zeros(BLOCK, VOCAB), step(4, forwards=4), MASK)


def reference_unmask(block: Tensor, logits: Tensor, block_step: BlockStep) -> Tensor:
    """The per-item rule as the module docstring states it, one position at a time."""
    masked = [i for i in range(BLOCK) if block[i] == MASK]
    if not masked:
        return block
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    scores = logprobs.clone()
    scores[:, MASK] = -torch.inf
    params = block_step.params
    if params.temperature > 0.0:  # Gumbel-max in float64
        generator = torch.Generator().manual_seed(step_seed(params.seed, block_step.block, block_step.step))
        uniform = torch.rand(scores.shape, generator=generator, dtype=torch.float64)
        scores = scores.double() + params.temperature * -torch.log(-torch.log(uniform))
    proposal = scores.argmax(-1)
    confidence = {i: float(logprobs[i, proposal[i]].exp()) for i in masked}
    by_confidence = sorted(masked, key=lambda i: -confidence[i])
    left = block_step.forwards_left
    if left is None:
        chosen = {i for i in masked if confidence[i] >= params.threshold} | {by_confidence[0]}
    else:
        chosen = set(by_confidence[: schedule_quota(len(masked), left)])
    out = block.clone()
    for i in chosen:
        out[i] = proposal[i]
    return out


@settings(max_examples=60)
@given(
    items=st.lists(
        st.tuples(
            st.integers(0, BLOCK),  # masked positions
            st.sampled_from([None, 1, 2, 5, 32]),  # forwards planned (None: threshold)
            st.sampled_from([0.0, 0.7]),  # temperature
            st.integers(0, 2**16),  # seed of the logits and the sampler
        ),
        min_size=1,
        max_size=6,
    )
)
def test_a_batch_unmasks_each_item_as_if_alone(items: list[tuple[int, int | None, float, int]]) -> None:
    blocks, logits, steps = [], [], []
    for masked, forwards, temperature, seed in items:
        generator = torch.Generator().manual_seed(seed)
        block = torch.randint(0, MASK, (BLOCK,), generator=generator)
        block[torch.randperm(BLOCK, generator=generator)[:masked]] = MASK
        # a schedule never has more forwards left than masks: each forward commits at least one
        taken = 0 if forwards is None or not masked else max(forwards - masked, 0)
        blocks.append(block)
        logits.append(torch.randn(BLOCK, VOCAB, generator=generator) * 3)
        params = SamplingParams(threshold=0.2, temperature=temperature, seed=seed)
        steps.append(BlockStep(params, block=seed % 3, step=taken, forwards=forwards))
    out = unmask(torch.stack(blocks), torch.stack(logits), steps, MASK).tokens
    for i, (block, item_logits, block_step) in enumerate(zip(blocks, logits, steps, strict=True)):
        assert torch.equal(out[i], reference_unmask(block, item_logits, block_step))
