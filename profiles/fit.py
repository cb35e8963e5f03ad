"""Fit the measured iteration-time model and report its held-out error.

Candidates differ in which terms they use and in the knee of the linear term; for each, the
coefficients come from least squares on relative error (rows divided by their measured time),
dropping any physical term that would come out negative (the CUDA-graph terms may be negative:
a replay saves host time). The candidate with the lowest K-fold cross-validated mean absolute
percentage error wins; its cross-validation errors (every point predicted by a fit that did
not see it) are the reported held-out figures, and the final coefficients use every point.
Each candidate may take `per_mixed` (a microbatch with both prefills and decodes) only where that
lowers its held-out MAPE by more than one standard error of the candidate's own held-out errors (taken
unpaired, which asks more of the term than the paired difference would): a term must earn its place. On the
H200 LLaDA-8B's shipped FP8 profile takes it (3.33% -> 2.90%) and Dream-7B's does not (3.91%, 3.61% with it:
less than a standard error); LLaDA-8B's bf16 profile would gain 0.015 points (its standard error 0.016), the
others nothing, and they keep their fits.

`fit_graphs` fits each CUDA-graph bucket's own line (`GraphTimes`) on that bucket's decode-only replays,
by the same relative least squares, with its leave-one-out error.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

import numpy as np

from profiles.measured import TERMS, Coefficients, Features, GraphTimes, predict
from profiles.shapes import Shape

SIGNED = ("graph", "per_graph_item")  # may be negative
LINE_CONTEXTS = 3  # the fewest longest contexts a bucket's replays span for a line (and its leave-one-out)
CANDIDATES = {  # name -> terms it may use
    "shared": tuple(t for t in TERMS if t not in ("per_graph_item", "per_mixed")),
    "graph-items": tuple(t for t in TERMS if t != "per_mixed"),
}
MIXED = "-mixed"  # a candidate's variant with per_mixed too: kept only where it earns its term (`fit`)


@dataclass(frozen=True, slots=True)
class Sample:
    features: Features
    seconds: float


@dataclass(frozen=True, slots=True)
class FitReport:
    coefficients: Coefficients
    candidate: str
    points: int
    folds: int
    heldout_mape: float  # percent, over every point held out once
    heldout_p90: float  # percent, 90th percentile of absolute percentage error
    heldout_max: float

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["coefficients"] = asdict(self.coefficients)
        return out


def solve(samples: Sequence[Sample], knee: float, terms: Sequence[str] = TERMS) -> Coefficients:
    """Relative least squares for a fixed knee over `terms`; physical terms kept non-negative."""
    x = np.array([s.features.row(knee) for s in samples])
    y = np.array([s.seconds for s in samples])
    w = 1.0 / y
    active = [i for i, term in enumerate(TERMS) if term in terms and (x[:, i].any() or term == "overhead")]
    while True:
        coef, *_ = np.linalg.lstsq(x[:, active] * w[:, None], y * w, rcond=None)
        negative = [a for a, c in zip(active, coef, strict=True) if c < 0 and TERMS[a] not in SIGNED]
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
    top = max(max(s.features.tokens for s in samples), 64.0)
    return [0.0, *(float(round(32 * 2 ** (i / 4))) for i in range(int(4 * math.log2(top / 32)) + 1))]


def _cross_validate(
    samples: Sequence[Sample], knee: float, terms: Sequence[str], order: list[int], folds: int
) -> list[float]:
    errs: list[float] = []
    for k in range(folds):
        test = [samples[i] for i in order[k::folds]]
        train = [samples[i] for j, i in enumerate(order) if j % folds != k]
        errs += errors(solve(train, knee, terms), test)
    return errs


class _Trial(NamedTuple):
    """One candidate's terms at its best knee, and its held-out errors there."""

    mape: float
    name: str
    terms: tuple[str, ...]
    knee: float
    errs: list[float]


def fit(samples: Sequence[Sample], seed: int = 0, folds: int = 10) -> FitReport:
    """Choose terms and knee by K-fold held-out error; refit the winner on every point."""
    if len(samples) < 5 * folds:
        raise ValueError(f"need at least {5 * folds} measured iterations to fit, got {len(samples)}")
    order = list(range(len(samples)))
    random.Random(seed).shuffle(order)
    best: _Trial | None = None
    for name, terms in CANDIDATES.items():
        chosen = base = _best_knee(samples, name, terms, order, folds)
        if any(s.features.mixed for s in samples):
            mixed = _best_knee(samples, name + MIXED, (*terms, "per_mixed"), order, folds)
            # per_mixed must beat its base by more than one standard error of the base's held-out errors
            if mixed.mape < base.mape - statistics.stdev(base.errs) / math.sqrt(len(base.errs)):
                chosen = mixed
        if best is None or chosen.mape < best.mape:
            best = chosen
    assert best is not None
    errs = sorted(best.errs)
    p90 = errs[min(len(errs) - 1, math.ceil(0.9 * len(errs)) - 1)]
    coefficients = solve(samples, best.knee, best.terms)
    return FitReport(coefficients, best.name, len(samples), folds, best.mape, p90, errs[-1])


def _best_knee(
    samples: Sequence[Sample], name: str, terms: tuple[str, ...], order: list[int], folds: int
) -> _Trial:
    """`terms` at the knee that gives the lowest held-out MAPE."""
    best: _Trial | None = None
    for knee in _knees(samples):
        errs = _cross_validate(samples, knee, terms, order, folds)
        mape = sum(errs) / len(errs)
        if best is None or mape < best.mape:
            best = _Trial(mape, name, terms, knee, errs)
    assert best is not None
    return best


@dataclass(frozen=True, slots=True)
class GraphFit:
    graphs: GraphTimes
    points: int
    heldout_mape: float  # percent, each replay predicted by its bucket's line fitted without it

    def as_dict(self) -> dict[str, Any]:
        lines = {key: list(values) for key, values in asdict(self.graphs).items()}  # as JSON gives them back
        return {**lines, "points": self.points, "heldout_mape": self.heldout_mape}


def _line(points: Sequence[tuple[int, float]]) -> tuple[float, float, list[float]]:
    """(fixed, per_longest) by relative least squares over (longest context, seconds), and each point's
    leave-one-out absolute percentage error (from the hat matrix: residual / (1 - leverage)). A slope that
    would come out negative is dropped (a replay never gets cheaper with a longer context)."""
    y = np.array([seconds for _, seconds in points])
    w = 1.0 / y
    x = np.array([[1.0, longest] for longest, _ in points]) * w[:, None]
    (fixed, slope), *_ = np.linalg.lstsq(x, y * w, rcond=None)
    if slope < 0:
        x, slope = x[:, :1], 0.0
        (fixed,), *_ = np.linalg.lstsq(x, y * w, rcond=None)
    leverage = np.einsum("ij,jk,ik->i", x, np.linalg.pinv(x.T @ x), x)
    residual = (y - fixed - slope * np.array([longest for longest, _ in points])) * w
    heldout = 100 * np.abs(residual / np.maximum(1.0 - leverage, 1e-12))
    return float(fixed), float(slope), heldout.tolist()


def fit_graphs(samples: Sequence[tuple[Shape, float]], buckets: Sequence[int]) -> GraphFit | None:
    """Each bucket's line over its decode-only replays (those whose replays span at least `LINE_CONTEXTS`
    longest contexts, so that leaving any one out still leaves a line); None if no bucket has them."""
    by_bucket: dict[int, list[tuple[int, float]]] = {}
    for shape, seconds in samples:
        bucket = shape.graph_bucket(buckets)
        if bucket:
            by_bucket.setdefault(bucket, []).append((max(shape.decodes), seconds))
    fitted: list[tuple[int, float, float]] = []
    errs: list[float] = []
    for bucket, points in sorted(by_bucket.items()):
        if len({longest for longest, _ in points}) >= LINE_CONTEXTS:
            fixed, slope, heldout = _line(points)
            fitted.append((bucket, fixed, slope))
            errs += heldout
    if not fitted:
        return None
    graphs = GraphTimes(
        tuple(b for b, _, _ in fitted), tuple(f for _, f, _ in fitted), tuple(s for _, _, s in fitted)
    )
    return GraphFit(graphs, len(errs), sum(errs) / len(errs))
