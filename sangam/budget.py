"""How a worker forms microbatches: the batching policy and its token budget (tau)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum


class Policy(StrEnum):
    DEFICIT = "deficit"  # Algorithm 1 under budget tau
    PREFILL_FIRST = "prefill-first"  # tau = infinity: Orca / vLLM / dLLM-Serve refresh-reuse
    FASTDLLM = "fastdllm"  # one request at a time (the paper's in-system Fast-dLLM)


@dataclass(frozen=True, slots=True)
class BatchConfig:
    """How one worker forms microbatches."""

    policy: Policy = Policy.DEFICIT
    budget: int = 1024  # tau, tokens per iteration (ignored by prefill-first)
    max_decodes: int = 64  # decodes seated per iteration; more wait their turn

    def __post_init__(self) -> None:
        if self.budget <= 0:
            raise ValueError(f"budget must be a positive number of tokens, got {self.budget}")
        if self.max_decodes <= 0:
            raise ValueError(f"max_decodes must be positive, got {self.max_decodes}")

    @property
    def tau(self) -> float:
        return math.inf if self.policy is Policy.PREFILL_FIRST else self.budget
