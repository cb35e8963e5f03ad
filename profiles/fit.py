"""Fit the measured iteration-time model and report its held-out error.

The knee of the linear term is found by a search over candidate values; for each, the other
coefficients come from least squares on relative error (rows divided by their measured time),
dropping any term that would come out negative. Candidates are compared by K-fold held-out
mean absolute percentage error, and a final 80/20 split gives the reported held-out figures.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from profiles.measured import TERMS, Coefficients, Features, predict


@dataclass(frozen=True, slots=True)
class Sample:
    features: Features
    seconds: float


@dataclass(frozen=True, slots=True)
class FitReport:
    coefficients: Coefficients
    train_points: int
    heldout_points: int
    heldout_mape: float  # percent
    heldout_p90: float  # percent, 90th percentile of absolute percentage error
    heldout_max: float
    cv_mape: float  # K-fold, on the chosen knee

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["coefficients"] = asdict(self.coefficients)
        return out


def solve(samples: Sequence[Sample], knee: float) -> Coefficients:
    """Non-negative (except the graph term) relative least squares for a fixed knee."""
    x = np.array([s.features.row(knee) for s in samples])
    y = np.array([s.seconds for s in samples])
    w = 1.0 / y
    active = [i for i, term in enumerate(TERMS) if x[:, i].any() or term == "overhead"]
    while True:
        coef, *_ = np.linalg.lstsq(x[:, active] * w[:, None], y * w, rcond=None)
        negative = [a for a, c in zip(active, coef, strict=True) if c < 0 and TERMS[a] != "graph"]
        if not negative:
            break
        active.remove(min(negative, key=lambda a: coef[active.index(a)]))
    values = dict.fromkeys(TERMS, 0.0)
    for a, c in zip(active, coef, strict=True):
        values[TERMS[a]] = float(c)
    return Coefficients(**values, knee=knee)


def errors(c: Coefficients, samples: Sequence[Sample]) -> list[float]:
    """Absolute percentage errors."""
    return [100 * abs(predict(c, s.features) - s.seconds) / s.seconds for s in samples]


def _knees(samples: Sequence[Sample]) -> list[float]:
    tokens = sorted({s.features.tokens for s in samples})
    top = max(tokens[-1], 64.0)
    return [0.0, *(float(round(32 * 2 ** (i / 4))) for i in range(int(4 * math.log2(top / 32)) + 1))]


def _cv_mape(samples: Sequence[Sample], knee: float, folds: int, rng: random.Random) -> float:
    order = list(range(len(samples)))
    rng.shuffle(order)
    errs: list[float] = []
    for k in range(folds):
        test = [samples[i] for i in order[k::folds]]
        train = [samples[i] for j, i in enumerate(order) if j % folds != k]
        errs += errors(solve(train, knee), test)
    return sum(errs) / len(errs)


def fit(samples: Sequence[Sample], seed: int = 0, folds: int = 5) -> FitReport:
    """Choose the knee by K-fold error on 80% of the points; report on the held-out 20%."""
    if len(samples) < 10 * folds:
        raise ValueError(f"need at least {10 * folds} measured iterations to fit, got {len(samples)}")
    rng = random.Random(seed)
    order = list(range(len(samples)))
    rng.shuffle(order)
    cut = len(order) // 5
    heldout = [samples[i] for i in order[:cut]]
    train = [samples[i] for i in order[cut:]]
    scored = [(_cv_mape(train, knee, folds, random.Random(seed)), knee) for knee in _knees(train)]
    cv, knee = min(scored)
    coefficients = solve(train, knee)
    errs = sorted(errors(coefficients, heldout))
    p90 = errs[min(len(errs) - 1, math.ceil(0.9 * len(errs)) - 1)]
    return FitReport(coefficients, len(train), len(heldout), sum(errs) / len(errs), p90, errs[-1], cv)
