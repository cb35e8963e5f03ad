"""Unmasking one block per forward: Fast-dLLM's confidence threshold, or a schedule fixed in advance.

Every forward proposes a token for each of the block's positions (argmax, or Gumbel-max at a
temperature) and scores it by its softmax probability under the raw logits. Then, among positions still
masked:

- threshold mode commits every proposal with confidence >= threshold, and always the most confident one,
  so a block needs between 1 and 32 forwards, data-dependent;
- schedule mode (`BlockStep.forwards = d`) commits the ceil(masked / forwards left) most confident ones,
  spreading the masks evenly so the block ends in exactly d forwards. Random weights are never confident,
  so timing runs use it to impose the progress model's per-block forward counts.

Dream's block start (`first_at_refresh`): in threshold mode, a block's first forward (its prefill) commits
exactly the block's first position, whatever its confidence, as Dream's own block generation with
Fast-dLLM does. That position's logit comes from the settled token to its left (Dream's head predicts the
next token), so it is the one position the refresh predicts from committed context alone.

At a temperature, the Gumbel noise and the noisy scores are float64, as LLaDA's reference sampler does
(its authors report that lower precision hurts quality).

Committed tokens are never re-masked.

Every forward's log-probabilities (the log-softmax of the raw logits, the mask id's column then set to
-inf) come back with the new tokens, so that a request asking for log-probs reads the very numbers its
tokens were scored by: a committed token's log-prob is the log of its confidence.
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


@dataclass(frozen=True, slots=True)
class Unmasked:
    """One forward's sampling: the new block tokens (N, 32) and the log-probabilities (N, 32, vocab)
    they were scored by (the mask id's at -inf), both on the logits' device."""

    tokens: Tensor
    logprobs: Tensor


def unmask(
    block_tokens: Tensor,
    logits: Tensor,
    steps: Sequence[BlockStep],
    mask_id: int,
    *,
    first_at_refresh: bool = False,
) -> Unmasked:
    """New block tokens (N, 32) from tokens (N, 32) and logits (N, 32, vocab), with their log-probs.

    `first_at_refresh` (Dream): a threshold-mode item's first forward of a block commits exactly the
    block's first position (the module's docstring says why).

    The whole batch is sampled with a fixed handful of kernels and no host sync: which positions are
    masked and how many each schedule commits are read from `block_tokens`, best passed on the host.
    """
    host = block_tokens.cpu()
    masked_host = host == mask_id
    quotas, thresholds, firsts = [], [], []
    for count, first_masked, step in zip(
        masked_host.sum(-1).tolist(), masked_host[:, 0].tolist(), steps, strict=True
    ):
        left = step.forwards_left
        quotas.append(1 if left is None else schedule_quota(count, left))
        thresholds.append(step.params.threshold if left is None else torch.inf)
        firsts.append(first_at_refresh and left is None and step.step == 0 and first_masked)
    device = logits.device
    tokens = to_device(host, device)
    quota = to_device(torch.tensor(quotas)[:, None], device)
    threshold = to_device(torch.tensor(thresholds)[:, None], device)
    masked = tokens == mask_id
    logprobs = log_probs(logits, mask_id)
    proposal, confidence = propose(logits, mask_id, steps, logprobs)
    commit = masked & (top_commits(confidence.masked_fill(~masked, -1.0), quota) | (confidence >= threshold))
    if any(firsts):
        only_first = to_device(torch.tensor(firsts)[:, None], device)
        at_start = torch.arange(commit.shape[-1], device=device) == 0
        commit = torch.where(only_first, at_start.expand_as(commit), commit)
    return Unmasked(torch.where(commit, proposal, tokens), logprobs)


def log_probs(logits: Tensor, mask_id: int) -> Tensor:
    """The raw log-softmax of `logits` in float32, the mask id's then set to -inf: the mask id is never
    proposed (committing it would leave the position masked and break the at-least-one-commit
    guarantee; random weights do propose it), but its probability stays in the normalisation."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    logprobs[..., mask_id] = -torch.inf
    return logprobs


def propose(
    logits: Tensor, mask_id: int, steps: Sequence[BlockStep], logprobs: Tensor
) -> tuple[Tensor, Tensor]:
    """Proposed tokens (N, 32) and their confidence, the raw softmax probability, (N, 32): argmax items
    together, Gumbel-max items (temperature > 0) each with its step's generator (`logprobs`: the
    logits' `log_probs`)."""
    proposal = logprobs.argmax(-1)
    for i, step in enumerate(steps):
        if step.params.temperature > 0.0:
            noise = gumbel(logprobs.shape[1:], _generator(step, logits.device))
            scores = logits[i].double()
            scores[..., mask_id] = -torch.inf
            # argmax(l / T + g) scaled by T: a tiny T cannot overflow every score to -inf (then argmax is 0)
            proposal[i] = (scores + step.params.temperature * noise).argmax(-1)
    # the proposal is never the mask id, so the masked-out column does not change its confidence
    return proposal, logprobs.gather(-1, proposal[..., None]).squeeze(-1).exp()


def gumbel(shape: torch.Size, generator: torch.Generator | None) -> Tensor:
    """Standard Gumbel noise of `shape` in float64, drawn from `generator` (on its device)."""
    device = generator.device if generator is not None else None
    uniform = torch.rand(shape, generator=generator, device=device, dtype=torch.float64)
    return -torch.log(-torch.log(uniform.clamp_min(torch.finfo(torch.float64).tiny)))


def top_commits(confidence: Tensor, count: Tensor) -> Tensor:
    """Per row, the `count` most confident positions, ties to the lower position (`confidence` (N, 32),
    below 0 where nothing may be committed; `count` (N, 1))."""
    order = confidence.argsort(dim=-1, descending=True, stable=True)
    positions = torch.arange(order.shape[-1], device=order.device).expand_as(order)
    rank = torch.empty_like(order).scatter_(-1, order, positions)
    return rank < count


def to_device(host: Tensor, device: torch.device) -> Tensor:
    """A copy that does not wait for the work queued on the GPU (pinned, asynchronous)."""
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


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
