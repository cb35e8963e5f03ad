"""How many denoising forwards each 32-token block needs (d in [1, 32]).

The count is data-dependent under confidence-threshold unmasking (paper section 3.2).
The simulator draws it to advance requests; live runs on random weights force the same
draws so that sim and live do identical work. A seeded generator is always passed in.
"""

from __future__ import annotations

import bisect
import itertools
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from sangam.hardware import BLOCK

# Defaults per (model, trace): mean and std of forwards per block. ASSUMPTION, to be
# calibrated with real weights: content blocks of LLaDA take about 8-16 forwards at
# threshold 0.9 (2-4 tokens per step, Fast-dLLM GSM8K figures), Dream commits fewer tokens
# per step than LLaDA; no chat or summarisation figures are published.
DEFAULT_PROGRESS: dict[tuple[str, str], tuple[float, float]] = {
    ("llada-8b", "sharegpt"): (10.0, 5.0),
    ("llada-8b", "arxiv"): (9.0, 4.5),
    ("dream-7b", "sharegpt"): (13.0, 6.0),
    ("dream-7b", "arxiv"): (12.0, 5.5),
}


@dataclass(frozen=True, slots=True)
class ProgressModel:
    """A discrete distribution over forwards per block, sampled by inverse CDF."""

    name: str
    values: tuple[int, ...]
    cdf: tuple[float, ...]

    def draw(self, rng: random.Random) -> int:
        """Forwards the next block needs."""
        return self.values[bisect.bisect_right(self.cdf, rng.random() * self.cdf[-1])]

    def plan(self, n_blocks: int, rng: random.Random) -> tuple[int, ...]:
        """Forwards for each of a request's blocks: `draw` for each, inlined (a run plans every block)."""
        values, cdf, random = self.values, self.cdf, rng.random
        total = cdf[-1]
        return tuple([values[bisect.bisect_right(cdf, random() * total)] for _ in range(n_blocks)])

    @property
    def mean(self) -> float:
        weights = [b - a for a, b in zip((0.0, *self.cdf), self.cdf, strict=False)]
        return sum(v * w for v, w in zip(self.values, weights, strict=True)) / self.cdf[-1]


def _from_weights(name: str, values: Sequence[int], weights: Sequence[float]) -> ProgressModel:
    return ProgressModel(name, tuple(values), tuple(itertools.accumulate(weights)))


def fixed(d: int) -> ProgressModel:
    """Every block takes exactly `d` forwards."""
    _check_steps(d)
    return _from_weights(f"fixed:{d}", [d], [1.0])


def uniform(lo: int, hi: int) -> ProgressModel:
    """Forwards uniform on [lo, hi]."""
    _check_steps(lo)
    _check_steps(hi)
    if lo > hi:
        raise ValueError(f"uniform progress needs lo <= hi, got {lo} > {hi}")
    return _from_weights(f"uniform:{lo}:{hi}", range(lo, hi + 1), [1.0] * (hi - lo + 1))


def beta_binomial(mean: float, std: float) -> ProgressModel:
    """1 + BetaBinomial(31, a, b) with the given mean and standard deviation."""
    n = BLOCK - 1
    if not 1.0 < mean < BLOCK:
        raise ValueError(f"mean forwards per block must lie strictly between 1 and {BLOCK}, got {mean}")
    p = (mean - 1) / n
    lo, hi = math.sqrt(n * p * (1 - p)), math.sqrt(n * n * p * (1 - p))
    if not lo < std < hi:  # the variance over the binomial's in (1, n), checked before it is squared
        raise ValueError(f"spread {std} out of range for mean {mean}: choose between {lo:.2f} and {hi:.2f}")
    ratio = std**2 / (n * p * (1 - p))
    total = (n - ratio) / (ratio - 1)
    a, b = p * total, (1 - p) * total
    log_beta = math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)
    weights = [
        math.exp(
            math.lgamma(n + 1)
            - math.lgamma(k + 1)
            - math.lgamma(n - k + 1)
            + math.lgamma(k + a)
            + math.lgamma(n - k + b)
            - math.lgamma(n + a + b)
            - log_beta
        )
        for k in range(n + 1)
    ]
    return _from_weights(f"betabinom:{mean:g}:{std:g}", range(1, BLOCK + 1), weights)


def empirical(samples: Sequence[int]) -> ProgressModel:
    """Draw from observed per-block forward counts."""
    if not samples:
        raise ValueError("empirical progress needs at least one sample")
    for d in samples:
        _check_steps(d)
    counts = {d: samples.count(d) for d in sorted(set(samples))}
    return _from_weights(f"empirical:{len(samples)}", list(counts), [float(c) for c in counts.values()])


def counts_spec(samples: Sequence[int]) -> str:
    """`counts:D=N,...`: observed forwards per block written inline (`parse_progress` reads it back)."""
    counts = {d: samples.count(d) for d in sorted(set(samples))}
    return "counts:" + ",".join(f"{d}={n}" for d, n in counts.items())


MAX_COUNT = 2**53  # blocks counted at one forwards count: exact as a float weight


def _from_counts(text: str) -> ProgressModel:
    pairs = [item.partition("=") for item in text.split(",") if item]
    if not pairs or any(not sep for _, sep, _ in pairs):
        raise ValueError("counts need D=N pairs")
    counts: dict[int, int] = {}
    for steps_text, _, count_text in pairs:
        if (steps := _whole(steps_text)) in counts:
            raise ValueError(f"forwards {steps} counted twice")
        counts[steps] = _whole(count_text)
    if any(not 0 <= n <= MAX_COUNT for n in counts.values()) or not sum(counts.values()):
        raise ValueError(f"counts must lie in [0, {MAX_COUNT}] with a positive total")
    seen = {d: n for d, n in sorted(counts.items()) if n}  # as `empirical` of the samples they count
    for steps in seen:
        _check_steps(steps)
    return _from_weights(f"empirical:{sum(seen.values())}", list(seen), [float(n) for n in seen.values()])


def default_progress(model: str, trace: str) -> ProgressModel:
    """The documented default for a (model, trace) pair; other traces use ShareGPT's."""
    mean, std = DEFAULT_PROGRESS.get((model, trace), DEFAULT_PROGRESS[(model, "sharegpt")])
    return beta_binomial(mean, std)


def parse_progress(spec: str, samples: Sequence[int] | None = None) -> ProgressModel:
    """`fixed:D`, `uniform:LO:HI`, `betabinom:MEAN:STD`, `counts:D=N,...` (observed forwards, inline), or
    `empirical` with `samples` given."""
    kind, _, rest = spec.partition(":")
    args = rest.split(":") if rest else []
    try:
        if kind == "fixed" and len(args) == 1:
            return fixed(_whole(args[0]))
        if kind == "uniform" and len(args) == 2:
            return uniform(_whole(args[0]), _whole(args[1]))
        if kind == "betabinom" and len(args) == 2:
            return beta_binomial(_finite(args[0]), _finite(args[1]))
        if kind == "counts" and len(args) == 1:
            return _from_counts(args[0])
    except ValueError as err:
        raise ValueError(f"bad progress model {spec!r}: {err}") from None
    if kind == "empirical" and samples is not None:
        return empirical(samples)
    raise ValueError(
        f"bad progress model {spec!r}: use fixed:D, uniform:LO:HI, betabinom:MEAN:STD, counts:D=N,... or "
        "empirical:FILE"
    )


def _whole(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a whole number") from None


def _finite(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise ValueError(f"{text!r} is not a finite number")
    return value


def _check_steps(d: int) -> None:
    if not 1 <= d <= BLOCK:
        raise ValueError(f"forwards per block must be in [1, {BLOCK}], got {d}")
