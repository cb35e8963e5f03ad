"""What the scheduler checks before it accepts a request or a worker, and a worker before it runs a block
(one-line reasons, no exceptions)."""

from __future__ import annotations

import math
from collections.abc import Iterable

from executor.control.messages import MAX_TOP_LOGPROBS, BlockWork, ModelFacts, Registration, Submission
from sangam.hardware import BLOCK, pages_for
from sangam.layout import Layout, Role


def check_submission(sub: Submission, facts: ModelFacts, mask_len: int) -> str | None:
    """Why a submitted request cannot run, as one line, or None. Its own mask buffer
    (`Submission.response_len`) sizes its context and KV pages; `mask_len` (the server's) is the
    largest allowed."""
    prompt, gen_len, own = sub.prompt, sub.gen_len, sub.response_len
    if not prompt:
        return "empty prompt"
    if gen_len <= 0 or gen_len % BLOCK:
        return f"gen length {gen_len} is not a positive multiple of {BLOCK}"
    if own < gen_len or own % BLOCK:
        return f"mask length {own} must be a multiple of {BLOCK} no shorter than the gen length {gen_len}"
    if own > mask_len:
        what = "mask" if sub.mask_len else "gen"
        return f"{what} length {own} exceeds the mask buffer of {mask_len} tokens"
    if len(prompt) + own > facts.context_len:
        return (
            f"prompt too long for the model's context window: {len(prompt)} prompt tokens plus a "
            f"{own}-token mask buffer exceed {facts.context_len} tokens"
        )
    pages = pages_for(len(prompt) + own)
    if pages > facts.pages:
        return (
            f"prompt too long for the KV pool: {len(prompt)} prompt tokens plus a {own}-token mask "
            f"buffer need {pages} KV pages, a worker holds {facts.pages}"
        )
    if min(prompt) < 0 or max(prompt) >= facts.vocab:
        position, token = next((i, t) for i, t in enumerate(prompt) if not 0 <= t < facts.vocab)
        return f"prompt token {token} at position {position} is outside the vocabulary [0, {facts.vocab})"
    if facts.mask_id in prompt:
        return f"prompt token at position {prompt.index(facts.mask_id)} is the mask id {facts.mask_id}"
    n_blocks = gen_len // BLOCK
    if sub.forwards:
        if len(sub.forwards) != n_blocks:
            return f"{len(sub.forwards)} planned forwards for {n_blocks} blocks"
        if any(not 1 <= d <= BLOCK for d in sub.forwards):
            return f"planned forwards must lie in [1, {BLOCK}], got {list(sub.forwards)}"
    sampling = sub.sampling
    if sampling.threshold is not None and not 0.0 < sampling.threshold <= 1.0:
        return f"threshold must lie in (0, 1], got {sampling.threshold}"
    if sampling.temperature is not None and not 0.0 <= sampling.temperature < math.inf:
        return f"temperature must be a finite number >= 0, got {sampling.temperature}"
    if sampling.logprobs is not None and not 0 <= sampling.logprobs <= MAX_TOP_LOGPROBS:
        return f"log-prob alternatives must lie in [0, {MAX_TOP_LOGPROBS}], got {sampling.logprobs}"
    return None


def check_registration(reg: Registration, layout: Layout, others: Iterable[Registration]) -> str | None:
    """Why a worker that is not registered yet cannot join `layout` beside `others`, or None."""
    if not 0 <= reg.worker_id < layout.num_workers:
        return f"worker id {reg.worker_id} outside 0..{layout.num_workers - 1}"
    role = layout.roles[reg.worker_id].value
    if (reg.role or Role.COLOCATED.value) != role:
        return (
            f"worker {reg.worker_id} has the {reg.role or 'colocated'} role, "
            f"{layout.name} gives it the {role} role"
        )
    for other in others:
        if (other.vocab, other.mask_id, other.eos_ids) != (reg.vocab, reg.mask_id, reg.eos_ids):
            return f"worker {reg.worker_id} serves a different model than worker {other.worker_id}"
    return None


def check_work(work: BlockWork) -> str | None:
    """Why a `BlockWork` cannot be run, or None (the scheduler validated the request already)."""
    seq_len = work.prompt_len + work.mask_len
    if work.prompt_len <= 0 or work.mask_len <= 0 or work.mask_len % BLOCK:
        return f"request {work.request_id}: bad lengths prompt {work.prompt_len} mask {work.mask_len}"
    if not 0 <= work.block < work.mask_len // BLOCK:
        return f"request {work.request_id}: block {work.block} outside a mask buffer of {work.mask_len}"
    if len(work.tokens) != work.prompt_len + BLOCK * work.block or len(work.tokens) > seq_len:
        return f"request {work.request_id}: {len(work.tokens)} known tokens for block {work.block}"
    if not 0 <= work.forwards <= BLOCK:
        return f"request {work.request_id}: {work.forwards} planned forwards"
    return None
