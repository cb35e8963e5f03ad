"""Log-probs on the worker, for the requests that ask (`Sampling.logprobs`): each forward's for the items
of those requests, kept per block as its forwards commit its positions. An iteration with no such item
computes nothing more than the sampler did.

A token's log-prob is read from the forward that committed it, from the very tensor the sampler scored
it by (`executor.model.sampler.Unmasked.logprobs`: the raw log-softmax, the mask id's at -inf), so it is
the log of the confidence its commit was decided on; its position's alternatives are that forward's top
tokens, the mask id never among them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from executor.control.messages import Logprobs
from executor.model.sampler import to_device
from sangam.hardware import BLOCK


@dataclass(frozen=True, slots=True)
class ForwardScores:
    """One forward's log-probs for some of its items, on the host: each position's proposal's and the
    `top` most likely tokens' (rows in the order of the items asked for)."""

    token: Tensor  # (R, 32) float32
    top_ids: Tensor  # (R, 32, top) int64
    top_logprobs: Tensor  # (R, 32, top) float32

    @classmethod
    def launch(cls, logprobs: Tensor, tokens: Tensor, rows: Sequence[int], top: int) -> ForwardScores:
        """Queue the work on the logits' device (`logprobs` (N, 32, vocab), `tokens` (N, 32) the new
        block tokens) for `rows`, with `top` alternatives each; `host` copies them back."""
        index = to_device(torch.tensor(rows), logprobs.device)
        picked, chosen = logprobs.index_select(0, index), tokens.index_select(0, index)
        token = picked.gather(-1, chosen[..., None]).squeeze(-1)
        top_logprobs, top_ids = picked.topk(top, dim=-1)
        return cls(token, top_ids, top_logprobs)

    def host(self) -> ForwardScores:
        return ForwardScores(self.token.cpu(), self.top_ids.cpu(), self.top_logprobs.cpu())


class BlockLogprobs:
    """The log-probs of one block's 32 positions, with `top` alternatives each, on the host: NaN until a
    forward commits the position."""

    def __init__(self, top: int) -> None:
        self.top = top
        self.token = torch.full((BLOCK,), math.nan)
        self.top_ids = torch.zeros((BLOCK, top), dtype=torch.long)
        self.top_logprobs = torch.full((BLOCK, top), math.nan)

    @classmethod
    def resumed(cls, logprobs: Logprobs) -> BlockLogprobs:
        """A block's log-probs as another worker's forwards left them (a KV transfer's handoff)."""
        block = cls(logprobs.top)
        block.token = torch.tensor(logprobs.token).float()
        block.top_ids = torch.tensor(logprobs.top_ids, dtype=torch.long).reshape(BLOCK, logprobs.top)
        block.top_logprobs = torch.tensor(logprobs.top_logprobs).float().reshape(BLOCK, logprobs.top)
        return block

    def record(self, committed: Tensor, scores: ForwardScores, row: int) -> None:
        """The positions `committed` (32,) by a forward take their log-probs from its `scores`' `row`."""
        self.token[committed] = scores.token[row][committed]
        self.top_ids[committed] = scores.top_ids[row, :, : self.top][committed]
        self.top_logprobs[committed] = scores.top_logprobs[row, :, : self.top][committed]

    def message(self) -> Logprobs:
        return Logprobs(
            tuple(self.token.tolist()), self.top, tuple(self.top_ids.flatten().tolist()),
            tuple(self.top_logprobs.flatten().tolist()),
        )  # fmt: skip
