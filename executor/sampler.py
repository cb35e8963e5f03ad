"""Unmasking one block per forward: Fast-dLLM's confidence threshold, or a schedule fixed in advance.

Every forward proposes a token for each of the block's positions (argmax, or Gumbel-max at a
temperature) and scores it by its softmax probability under the raw logits. Then, among positions still
masked:

- threshold mode commits every proposal with confidence >= threshold, and always the most confident one,
  so a block needs between 1 and 32 forwards, data-dependent;
- schedule mode (`BlockStep.forwards = d`) commits the ceil(masked / forwards left) most confident ones,
  spreading the masks evenly so the block ends in exactly d forwards. Random weights are never confident,
  so timing runs use it to impose the progress model's per-block forward counts.

Committed tokens are never re-masked.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How one request unmasks: its confidence threshold, temperature (0: argmax) and seed."""

    threshold: float = 0.9
    temperature: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"threshold must lie in (0, 1], got {self.threshold}")
        if self.temperature < 0.0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")


@dataclass(frozen=True, slots=True)
class BlockStep:
    """Where one item stands when its block's logits are sampled."""

    params: SamplingParams
    block: int  # block index within the request
    step: int  # forwards already done on this block; 0 is the prefill
    forwards: int | None = None  # schedule mode: the block must end after exactly this many forwards

    @property
    def forwards_left(self) -> int | None:
        """Forwards left including this one, in schedule mode."""
        if self.forwards is None:
            return None
        if not 0 <= self.step < self.forwards:
            raise ValueError(f"step {self.step} lies outside a schedule of {self.forwards} forwards")
        return self.forwards - self.step


def unmask(block_tokens: Tensor, logits: Tensor, steps: Sequence[BlockStep], mask_id: int) -> Tensor:
    """New block tokens (N, 32) after one forward, from tokens (N, 32) and logits (N, 32, vocab)."""
    return torch.stack(
        [
            unmask_block(tokens, item_logits, step, mask_id)
            for tokens, item_logits, step in zip(block_tokens, logits, steps, strict=True)
        ]
    )


def unmask_block(block_tokens: Tensor, logits: Tensor, step: BlockStep, mask_id: int) -> Tensor:
    """One block's tokens (32,) after committing this forward's proposals from logits (32, vocab)."""
    masked = block_tokens == mask_id
    if not masked.any():
        return block_tokens
    proposal, confidence = propose(logits, mask_id, step.params.temperature, _generator(step, logits.device))
    confidence = confidence.masked_fill(~masked, -1.0)
    forwards_left = step.forwards_left
    if forwards_left is None:
        commit = threshold_commits(confidence, masked, step.params.threshold)
    else:
        commit = top_commits(confidence, schedule_quota(int(masked.sum()), forwards_left))
    return torch.where(commit, proposal, block_tokens)


def propose(
    logits: Tensor, mask_id: int, temperature: float, generator: torch.Generator | None
) -> tuple[Tensor, Tensor]:
    """Proposed tokens (32,) and their confidence, the raw softmax probability, (32,).

    The mask id is never proposed: committing it would leave the position masked and break the
    at-least-one-commit guarantee (random weights do propose it).
    """
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    scores = logprobs.clone()
    scores[:, mask_id] = -torch.inf
    if temperature > 0.0:
        uniform = torch.rand(scores.shape, generator=generator, device=scores.device)
        gumbel = -torch.log(-torch.log(uniform.clamp_min(torch.finfo(torch.float32).tiny)))
        scores = scores / temperature + gumbel
    proposal = scores.argmax(dim=-1)
    return proposal, logprobs.gather(-1, proposal[:, None]).squeeze(-1).exp()


def threshold_commits(confidence: Tensor, masked: Tensor, threshold: float) -> Tensor:
    """Masked positions at or above `threshold`, plus the single most confident masked one."""
    commit = masked & (confidence >= threshold)
    commit[confidence.argmax()] = True
    return commit


def top_commits(confidence: Tensor, count: int) -> Tensor:
    """The `count` most confident positions (`confidence` is below 0 where nothing may be committed)."""
    commit = torch.zeros_like(confidence, dtype=torch.bool)
    commit[confidence.topk(count).indices] = True
    return commit


def schedule_quota(masked: int, forwards_left: int) -> int:
    """Commits now so `masked` masks end in exactly `forwards_left` forwards (needs masked >= left)."""
    return -(-masked // forwards_left)


def step_seed(seed: int, block: int, step: int) -> int:
    """A 63-bit seed for (request seed, block, step): reproducible whatever the batch composition."""
    digest = hashlib.blake2b(f"{seed}:{block}:{step}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def _generator(step: BlockStep, device: torch.device) -> torch.Generator | None:
    if step.params.temperature == 0.0:
        return None
    return torch.Generator(device=device).manual_seed(step_seed(step.params.seed, step.block, step.step))


def block_done(block_tokens: Tensor, mask_id: int) -> bool:
    """No mask left: the block ends with this forward."""
    return not bool((block_tokens == mask_id).any())


def commits_eos(block_tokens: Tensor, eos_ids: Sequence[int]) -> bool:
    """Whether an EOS id is committed in the block; generation then ends after this block."""
    return bool(torch.isin(block_tokens, torch.as_tensor(eos_ids, device=block_tokens.device)).any())


def ends_generation(block_tokens: Tensor, mask_id: int, eos_ids: Sequence[int]) -> bool:
    """The block is finished and holds an EOS: no later block is prefilled or denoised."""
    return block_done(block_tokens, mask_id) and commits_eos(block_tokens, eos_ids)


def before_eos(generated: Tensor, eos_ids: Sequence[int]) -> Tensor:
    """The generated tokens up to (not including) the first EOS, the request's answer."""
    is_eos = torch.isin(generated, torch.as_tensor(eos_ids, device=generated.device))
    if not is_eos.any():
        return generated
    return generated[: int(is_eos.int().argmax())]
