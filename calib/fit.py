"""`sangam fit`: a testbed's forwards per block fitted to observed load-curve points, or measured.

From targets (`calib.targets`): for each (model, trace) its beta-binomial's mean (and, if asked, its
spread) is chosen by `scipy.optimize` so that the simulated metrics of the targets come closest to the
observed ones, in the weighted mean of squared log ratios. Every evaluation simulates the same requests
(the same seed, hence the same lengths and arrival gaps) and draws each block's forwards from the same
uniforms by inverse CDF, so the objective moves smoothly with the parameters (common random numbers).
A leave-one-out check refits without each point and predicts it.

From live runs (`--blocks`): the forwards of every block in their blocks.csv, per (model, trace),
become an empirical model (`counts:D=N,...`).
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calib.points import PointKey, PointRunner, metric
from calib.targets import Target
from sangam.hardware import BLOCK
from sangam.options import option
from sangam.progress import counts_spec
from sangam.testbed import ProgressEntry, Testbed
from sangam.workload import MASK_LEN

TRIALS = BLOCK - 1  # a block's forwards are 1 + BetaBinomial(31, a, b)
MEAN_BOUNDS = (1.5, 30.0)
DISPERSION_BOUNDS = (0.005, 0.9)  # rho = 1 / (a + b + 1): 0 is binomial, 1 all-or-nothing
FREE = ("mean", "mean+std")


@dataclass(frozen=True, slots=True)
class FitOptions:
    """What `sangam fit` fits, to what, and where it writes the testbed."""

    targets: Path | None = option(
        None, "observed points, CSV: layout, policy, model, trace, budget, qps, metric, value, weight "
        "[, quote]", parse=Path, metavar="CSV",
    )  # fmt: skip
    blocks: tuple[Path, ...] = option(
        (), "instead: live run directories whose blocks.csv give forwards per block (empirical)",
        parse=lambda text: [Path(text)], many=True, metavar="DIR", default_text="none",
    )  # fmt: skip
    free: str = option(
        "mean", "free parameters per model and trace: the mean, or mean and spread", choices=FREE
    )
    name: str | None = option(None, "the new testbed's name", default_text="the base testbed's name + '-fit'")
    out: Path | None = option(
        None, "the new testbed's file", parse=Path, metavar="FILE",
        default_text="profiles/data/testbeds/NAME.json",
    )  # fmt: skip


def spread(mean: float, rho: float) -> float:
    """The standard deviation of 1 + BetaBinomial(31) with this mean and dispersion rho."""
    p = (mean - 1) / TRIALS
    return math.sqrt(TRIALS * p * (1 - p) * (1 + (TRIALS - 1) * rho))


def dispersion(mean: float, std: float) -> float:
    """The inverse of `spread`."""
    p = (mean - 1) / TRIALS
    return (std * std / (TRIALS * p * (1 - p)) - 1) / (TRIALS - 1)


def betabinom(mean: float, rho: float) -> str:
    return f"betabinom:{mean:.4g}:{spread(mean, rho):.4g}"


def start_of(spec: str) -> tuple[float, float]:
    """(mean, rho) of a betabinom spec; another model starts from the default's mean and dispersion."""
    kind, _, rest = spec.partition(":")
    mean, std = (float(x) for x in rest.split(":")) if kind == "betabinom" else (10.0, 5.0)
    return mean, min(max(dispersion(mean, std), DISPERSION_BOUNDS[0]), DISPERSION_BOUNDS[1])


@dataclass(frozen=True, slots=True)
class PointFit:
    target: Target
    simulated: float  # at the fitted parameters
    held_out: float | None  # predicted by a fit without this point (None: it is the pair's only point)


@dataclass(frozen=True, slots=True)
class PairFit:
    model: str
    trace: str
    mean: float
    rho: float
    objective: float
    evaluations: int
    points: tuple[PointFit, ...]

    @property
    def spec(self) -> str:
        return betabinom(self.mean, self.rho)


class Objective:
    """The simulated metrics of a pair's targets at a forwards-per-block spec, each simulation once."""

    def __init__(self, sim: PointRunner, targets: Sequence[Target], num_requests: int, seed: int) -> None:
        self.sim, self.targets, self.num_requests, self.seed = sim, list(targets), num_requests, seed
        self._seen: dict[tuple[PointKey, str], dict[str, Any]] = {}  # summaries by point and spec

    @property
    def evaluations(self) -> int:
        return len(self._seen)

    def simulated(self, index: int, spec: str) -> float:
        target = self.targets[index]
        key = (target.key, spec)
        if key not in self._seen:
            self._seen[key] = self.sim.run(target.key.config(self.num_requests, self.seed), spec).summary
        return metric(self._seen[key], target.metric)

    def loss(self, spec: str, indices: Sequence[int]) -> float:
        """Weighted mean squared log ratio of simulated to observed over `indices`."""
        total = sum(self.targets[i].weight for i in indices)
        return (
            sum(
                self.targets[i].weight * math.log(self.simulated(i, spec) / self.targets[i].value) ** 2
                for i in indices
            )
            / total
        )


def minimise(
    loss: Callable[[float, float], float], start: tuple[float, float], free: str
) -> tuple[float, float]:
    """The (mean, rho) of least `loss`: bounded Brent on the mean alone, else Nelder-Mead on both."""
    from scipy.optimize import minimize, minimize_scalar

    if free == "mean":
        rho = start[1]
        found = minimize_scalar(lambda m: loss(m, rho), bounds=MEAN_BOUNDS, method="bounded",
                                options={"xatol": 0.02})  # fmt: skip
        return float(found.x), rho
    found = minimize(
        lambda x: loss(x[0], x[1]), start, method="Nelder-Mead", bounds=[MEAN_BOUNDS, DISPERSION_BOUNDS],
        options={"xatol": 0.01, "fatol": 1e-5, "maxfev": 120},
    )  # fmt: skip
    return float(found.x[0]), float(found.x[1])


def fit_pair(objective: Objective, start: tuple[float, float], free: str) -> PairFit:
    """Fit one (model, trace): all its targets, then each left out in turn."""
    every = list(range(len(objective.targets)))

    def fitted(indices: Sequence[int]) -> tuple[float, float]:
        return minimise(lambda m, r: objective.loss(betabinom(m, r), indices), start, free)

    mean, rho = fitted(every)
    spec = betabinom(mean, rho)
    points = []
    for i in every:
        held_out = None
        if len(every) > 1:
            others = [j for j in every if j != i]
            held_out = objective.simulated(i, betabinom(*fitted(others)))
        points.append(PointFit(objective.targets[i], objective.simulated(i, spec), held_out))
    first = objective.targets[0]
    return PairFit(
        first.key.model, first.key.trace, mean, rho, objective.loss(spec, every), objective.evaluations,
        tuple(points),
    )  # fmt: skip


def fit_targets(
    testbed: Testbed, targets: Sequence[Target], free: str, num_requests: int, seed: int
) -> list[PairFit]:
    """Fit every (model, trace) the targets name, in the order they first appear."""
    sim = PointRunner(testbed)
    pairs = list(dict.fromkeys(t.pair for t in targets))
    fits = []
    for model, trace in pairs:
        mine = [t for t in targets if t.pair == (model, trace)]
        start = start_of(testbed.progress_spec(model, trace))
        fits.append(fit_pair(Objective(sim, mine, num_requests, seed), start, free))
    return fits


def fitted_testbed(
    base: Testbed,
    name: str,
    fits: Sequence[PairFit],
    targets_file: Path,
    free: str,
    num_requests: int,
    seed: int,
) -> Testbed:
    """`base` with the fitted forwards per block, recording the fit."""
    digest = hashlib.sha256(targets_file.read_bytes()).hexdigest()
    progress = dict(base.progress)
    record: dict[str, Any] = {
        "targets": targets_file.name,
        "targets_sha256": digest,
        "base": f"{base.name} v{base.version}",
        "free": free,
        "num_requests": num_requests,
        "seed": seed,
        "pairs": {},
    }
    for fit in fits:
        source = (
            f"fitted by sangam fit ({free} free) to {len(fit.points)} points of {targets_file.name} "
            f"(sha256 {digest[:12]}) on {base.name} v{base.version}, {num_requests} requests per point, "
            f"seed {seed}"
        )
        progress[(fit.model, fit.trace)] = ProgressEntry(fit.spec, source)
        record["pairs"][f"{fit.model}/{fit.trace}"] = {
            "mean": round(fit.mean, 4),
            "std": round(spread(fit.mean, fit.rho), 4),
            "objective": fit.objective,
            "points": [
                {
                    "point": p.target.label(),
                    "observed": p.target.value,
                    "simulated": p.simulated,
                    "held_out": p.held_out,
                }
                for p in fit.points
            ],
        }
    return dataclasses.replace(
        base, name=name, version=1, progress=progress, fit=record,
        description=f"{base.description} Forwards per block fitted by sangam fit.",
    )  # fmt: skip


def read_blocks(dirs: Sequence[Path]) -> dict[tuple[str, str], list[int]]:
    """Forwards of every block in the runs' blocks.csv, per (model, trace) of their summary.json; a run
    that forced the progress model's schedule (`--unmask schedule`) measured nothing and is refused."""
    found: dict[tuple[str, str], list[int]] = {}
    for directory in dirs:
        summary, blocks = directory / "summary.json", directory / "blocks.csv"
        if not summary.is_file() or not blocks.is_file():
            raise ValueError(f"{directory}: not a run directory (needs summary.json and blocks.csv)")
        config = json.loads(summary.read_text()).get("config", {})
        model, trace = config.get("model"), config.get("trace")
        if config.get("unmask") != "threshold":
            raise ValueError(
                f"{directory}: its forwards were not measured (unmask {config.get('unmask')!r}): use live "
                "runs with --unmask threshold"
            )
        if trace not in MASK_LEN:
            trace = "sharegpt"  # a trace file's requests are modelled as ShareGPT's (sangam.testbed)
        with blocks.open(newline="") as f:
            forwards = [int(row["forwards"]) for row in csv.DictReader(f) if row.get("forwards")]
        if not forwards:
            raise ValueError(f"{blocks}: no block with a forwards count")
        found.setdefault((str(model), str(trace)), []).extend(forwards)
    return found


def measured_testbed(base: Testbed, name: str, dirs: Sequence[Path]) -> Testbed:
    """`base` with the empirical forwards per block of live runs' blocks."""
    progress = dict(base.progress)
    runs = ", ".join(d.name for d in dirs)
    served = sorted({served_by(d) for d in dirs})
    counts: dict[str, int] = {}
    for (model, trace), forwards in read_blocks(dirs).items():
        source = f"measured: {len(forwards)} blocks of live runs ({runs}; {'; '.join(served)})"
        progress[(model, trace)] = ProgressEntry(counts_spec(forwards), source)
        counts[f"{model}/{trace}"] = len(forwards)
    record = {"blocks": counts, "runs": [d.name for d in dirs], "base": f"{base.name} v{base.version}"}
    return dataclasses.replace(
        base, name=name, version=1, description=f"{base.description} Forwards per block measured live.",
        progress=progress, fit=record,
    )  # fmt: skip


def served_by(directory: Path) -> str:
    """What served a live run: model, weights and threshold, from its summary.json."""
    config = json.loads((directory / "summary.json").read_text()).get("config", {})
    model = config.get("live_model") or config.get("model")
    return f"{model}, {config.get('weights', '?')} weights, threshold {config.get('threshold', '?')}"
