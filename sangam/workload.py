"""Synthetic workloads: request lengths fitted to the paper's traces, and arrival processes.

Pure: no file I/O (see `runs.traces`), and every random draw comes from a `random.Random`
passed in, so that a seed fixes the whole workload.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from sangam.hardware import BLOCK

MASK_LEN = {"sharegpt": 1024, "arxiv": 512}  # mask buffer M per dataset, a multiple of BLOCK
MAX_TOKENS = 4096  # the paper's filter: prompt_len + output_len <= MAX_TOKENS
MIN_ARRIVAL_CV = 1e-3  # gaps all but equal; 1e-300 squared to 0 and divided by it
MAX_ARRIVAL_CV = 100.0  # gamma gaps of a larger CV put nearly every arrival at once (shape 1/CV^2 -> 0)


@dataclass(frozen=True, slots=True)
class TraceRow:
    """One request of a trace: lengths in tokens, arrival in seconds (None: to be drawn).

    `steps`, when given, is the number of denoising forwards of each 32-token block, each in
    [1, 32], one per block: `ceil(output_len / 32)` of them. `max_tokens`, when given, is what the
    client asked for at most (at least `output_len`): the request's mask buffer is it rounded up to
    whole blocks (`sangam.request.response_region`) instead of the run's fixed one.
    """

    prompt_len: int
    output_len: int
    arrival_time: float | None = None
    steps: tuple[int, ...] | None = None
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        given = ("max_tokens",) if self.max_tokens is not None else ()
        for name in ("prompt_len", "output_len", *given):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.max_tokens is not None and self.max_tokens < self.output_len:
            raise ValueError(f"max_tokens {self.max_tokens} is less than output_len {self.output_len}")
        if self.arrival_time is not None and not (
            math.isfinite(self.arrival_time) and self.arrival_time >= 0
        ):
            raise ValueError(f"arrival_time must be a non-negative number, got {self.arrival_time!r}")
        if self.steps is not None:
            check_steps(self.steps, self.output_len)

    @property
    def n_blocks(self) -> int:
        return -(-self.output_len // BLOCK)


def check_steps(steps: Sequence[object], output_len: int) -> None:
    """Raise ValueError unless `steps` holds one count in [1, BLOCK] per block of `output_len`."""
    blocks = -(-output_len // BLOCK)
    if len(steps) != blocks:
        raise ValueError(
            f"steps has {len(steps)} values, but output_len {output_len} makes {blocks} blocks of {BLOCK}"
        )
    for d in steps:
        if isinstance(d, bool) or not isinstance(d, int) or not 1 <= d <= BLOCK:
            raise ValueError(f"steps must be integers in [1, {BLOCK}], got {d!r}")


# --- lengths -----------------------------------------------------------------------------------


class LengthDistribution(Protocol):
    """A continuous length distribution; `draw` returns one real-valued sample."""

    def draw(self, rng: random.Random) -> float: ...


@dataclass(frozen=True, slots=True)
class Kumaraswamy:
    """Kumaraswamy(a, b) scaled to [0, scale]: bounded, skewed either way; drawn by inverse CDF."""

    a: float
    b: float
    scale: float

    def draw(self, rng: random.Random) -> float:
        u = rng.random()
        return self.scale * (1.0 - (1.0 - u) ** (1.0 / self.b)) ** (1.0 / self.a)


@dataclass(frozen=True, slots=True)
class GeneralizedGamma:
    """Stacy's generalized gamma: `scale * G ** (1 / power)` with G ~ Gamma(shape, 1)."""

    shape: float
    power: float
    scale: float

    def draw(self, rng: random.Random) -> float:
        return self.scale * rng.gammavariate(self.shape, 1.0) ** (1.0 / self.power)


@dataclass(frozen=True, slots=True)
class LengthModel:
    """Independent prompt and output marginals, before the MAX_TOKENS filter."""

    prompt: LengthDistribution
    output: LengthDistribution


# Fitted offline (scipy least squares, continuous samples with the joint prompt + output <= 4096 filter
# applied) to the paper's Table 1: ShareGPT prompt median/p99/std 795/2007/596, output 266/874/206;
# arXiv prompt 2827/3923/890, output 162/360/73. ShareGPT prompts look truncated near 2048 tokens, hence
# the bounded Kumaraswamy; arXiv prompts are left-skewed and cut by the filter (about 28% of raw draws
# are rejected there); outputs have an open right tail.
LENGTHS: dict[str, LengthModel] = {
    "sharegpt": LengthModel(
        prompt=Kumaraswamy(a=0.789696, b=1.077022, scale=2042.901),
        output=GeneralizedGamma(shape=0.476324, power=2.312291, scale=525.3184),
    ),
    "arxiv": LengthModel(
        prompt=Kumaraswamy(a=2.225066, b=1.137588, scale=4675.346),
        output=GeneralizedGamma(shape=1.386577, power=2.043465, scale=159.4477),
    ),
}


def lookup_lengths(dataset: str) -> LengthModel:
    try:
        return LENGTHS[dataset]
    except KeyError:
        raise ValueError(f"unknown dataset {dataset!r} (known: {', '.join(LENGTHS)})") from None


def _tokens(x: float) -> int:
    return max(1, round(x))


def sample_lengths(dataset: str, n: int, rng: random.Random) -> list[tuple[int, int]]:
    """`n` (prompt_len, output_len) pairs of `dataset`, each >= 1, with prompt + output <= MAX_TOKENS
    and the output within the dataset's mask buffer (which the paper sizes for the longest output).

    Pairs that break the filter are redrawn, as the paper drops such requests.
    """
    model = lookup_lengths(dataset)
    if n < 0:
        raise ValueError(f"number of requests must be non-negative, got {n}")
    pairs: list[tuple[int, int]] = []
    while len(pairs) < n:
        prompt = _tokens(model.prompt.draw(rng))
        output = _tokens(model.output.draw(rng))
        if prompt + output <= MAX_TOKENS and output <= MASK_LEN[dataset]:
            pairs.append((prompt, output))
    return pairs


# --- arrivals ----------------------------------------------------------------------------------


def _check_rate(qps: float, cv: float | None) -> None:
    if not qps > 0:
        raise ValueError(f"qps must be positive, got {qps}")
    check_arrival_cv(cv)


def check_arrival_cv(cv: float | None) -> None:
    """None (Poisson) or a gamma CV in [MIN_ARRIVAL_CV, MAX_ARRIVAL_CV]; ValueError otherwise."""
    if cv is not None and not MIN_ARRIVAL_CV <= cv <= MAX_ARRIVAL_CV:
        raise ValueError(f"arrival CV must be in [{MIN_ARRIVAL_CV:g}, {MAX_ARRIVAL_CV:g}], got {cv}")


def check_arrival_clip(clip: float | None) -> None:
    """None (no clipping) or a positive number of mean gaps; ValueError otherwise."""
    if clip is not None and not clip > 0:
        raise ValueError(f"arrival clip must be a positive number of mean gaps, got {clip}")


def _gap(qps: float, cv: float | None, rng: random.Random, clip: float | None = None) -> float:
    """One inter-arrival gap: exponential when `cv` is None (at most `clip`/qps when `clip` is given, as
    the reference harness draws them), else gamma with mean 1/qps and CV `cv`."""
    if cv is None:
        gap = rng.expovariate(qps)
        return min(gap, clip / qps) if clip is not None else gap
    shape = 1.0 / (cv * cv)
    return rng.gammavariate(shape, 1.0 / (qps * shape))


def _arrivals(n: int, qps: float, cv: float | None, rng: random.Random) -> list[float]:
    _check_rate(qps, cv)
    times: list[float] = []
    now = 0.0
    for _ in range(n):
        now += _gap(qps, cv, rng)
        times.append(now)
    return times


def poisson_arrivals(n: int, qps: float, rng: random.Random) -> list[float]:
    """`n` Poisson arrival times at rate `qps`, non-decreasing, the first one gap after 0."""
    return _arrivals(n, qps, None, rng)


def gamma_arrivals(n: int, qps: float, cv: float, rng: random.Random) -> list[float]:
    """`n` arrival times with gamma gaps of mean 1/qps and coefficient of variation `cv` (1: Poisson)."""
    return _arrivals(n, qps, cv, rng)


def with_arrivals(
    rows: Sequence[TraceRow],
    qps: float,
    rng: random.Random,
    cv: float | None = None,
    clip: float | None = None,
) -> list[TraceRow]:
    """`rows` with every missing arrival time filled in; given times are kept.

    A missing time is the previous row's time (0 before the first row) plus one gap of the
    process (Poisson at `qps`, or gamma with CV `cv`), so a trace with no times at all gets
    exactly the times `poisson_arrivals` / `gamma_arrivals` would draw. `clip` caps exponential gaps
    at `clip`/qps (the reference harness uses 3: its real rate is 1/(1 - e^-3), 5.2% above `qps`).
    """
    _check_rate(qps, cv)
    check_arrival_clip(clip)
    if clip is not None and cv is not None:
        raise ValueError("an arrival clip applies to Poisson gaps only, not to gamma gaps (--arrival-cv)")
    out: list[TraceRow] = []
    now = 0.0
    for row in rows:
        if row.arrival_time is None:
            now += _gap(qps, cv, rng, clip)
            row = TraceRow(
                row.prompt_len, row.output_len, now, row.steps, row.max_tokens
            )  # not replace(): it looks up fields
        else:
            now = row.arrival_time
        out.append(row)
    return out
